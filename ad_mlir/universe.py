"""xDSL `xdsl.universe` entry point: stock `xdsl-opt` loads the `ad` dialect and our passes."""

from xdsl.ir import Dialect
from xdsl.universe import Universe

from ad_mlir.passes import get_ad_passes


def _ad_dialect() -> Dialect:
    from ad_mlir.dialects.ad import Ad

    return Ad


AD_UNIVERSE = Universe(all_dialects={"ad": _ad_dialect}, all_passes=get_ad_passes())
