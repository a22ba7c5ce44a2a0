"""xDSL `xdsl.universe` entry point: stock `xdsl-opt` loads the `ad` dialect and our passes."""

from xdsl.ir import Dialect
from xdsl.universe import Universe

from ad_mlir.passes import get_ad_passes


def _ad_dialect() -> Dialect:
    from ad_mlir.dialects.ad import Ad

    return Ad


def _passes_xdsl_lacks() -> dict:
    from xdsl.transforms import get_all_passes

    taken = get_all_passes()
    return {name: getter for name, getter in get_ad_passes().items() if name not in taken}


def _triton_target() -> type:
    from ad_mlir.codegen.target import TritonTarget

    return TritonTarget


AD_UNIVERSE = Universe(
    all_dialects={"ad": _ad_dialect}, all_passes=_passes_xdsl_lacks(), all_targets={"triton": _triton_target}
)
