"""The region kernel generator emits exactly the forms `dialects/kernel_forms.py` admits: the
fuser asks kernel_forms what a region may hold, so each op, `pow` exponent, reduction type and
float type admitted there needs an expression in the generator's tables (and one the check
never admits would be dead)."""

from ad_mlir.codegen.templates import region_kernel
from ad_mlir.dialects import kernel_forms


def test_the_generator_has_an_expression_for_each_admitted_form() -> None:
    assert set(region_kernel.UNARY) == set(kernel_forms.UNARY_OPS)
    assert set(region_kernel.BINARY) == set(kernel_forms.BINARY_OPS)
    assert set(region_kernel.COMPARE) == set(kernel_forms.COMPARE_OPS)
    assert set(region_kernel._POW_BY_EXPONENT) == set(kernel_forms.POW_EXPONENTS)
    assert set(region_kernel._NEUTRAL) == kernel_forms.REDUCTION_TYPES
    assert set(region_kernel._TL_FLOAT) == set(kernel_forms.KERNEL_FLOATS)
