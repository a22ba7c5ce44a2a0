// User errors: one located line on stderr, exit code 1, no Python traceback.
// RUN: not ad-opt %S/Inputs/syntax_error.mlir 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not ad-opt %S/Inputs/unknown_op.mlir 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not ad-opt %S/Inputs/undefined_value.mlir 2>&1 | filecheck %s --check-prefix=UNDEFINED
// RUN: not ad-opt %S/Inputs/type_mismatch.mlir 2>&1 | filecheck %s --check-prefix=TYPES
// RUN: not ad-opt %S/Inputs/operand_count.mlir 2>&1 | filecheck %s --check-prefix=COUNT
// RUN: not ad-opt %S/Inputs/operand_count_generic.mlir 2>&1 | filecheck %s --check-prefix=COUNT-GENERIC
// RUN: not ad-opt %S/Inputs/verify_error.mlir 2>&1 | filecheck %s --check-prefix=VERIFY
// RUN: not ad-opt %S/Inputs/verify_error.mlir -p bogus 2>&1 | filecheck %s --check-prefix=PASS
// RUN: not ad-opt %S/Inputs/does_not_exist.mlir 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: not ad-opt --model llama --hidden-size 48 2>&1 | filecheck %s --check-prefix=CONFIG
// RUN: ad-opt %S/Inputs/verify_error.mlir --verify-diagnostics | filecheck %s --check-prefix=VERIFY

// SYNTAX-NOT: Traceback
// SYNTAX: {{^.*}}syntax_error.mlir:3:3: error: type expected{{$}}
// SYNTAX-NOT: {{.}}

// UNKNOWN-NOT: Traceback
// UNKNOWN: {{^.*}}unknown_op.mlir:2:22: error: Operation ad.frobnicate is not registered{{$}}
// UNKNOWN-NOT: {{.}}

// UNDEFINED-NOT: Traceback
// UNDEFINED: {{^.*}}undefined_value.mlir:2:15: error: use of undefined value %z{{$}}
// UNDEFINED-NOT: {{.}}

// TYPES-NOT: Traceback
// TYPES: {{^.*}}type_mismatch.mlir:2:15: error: operand is used with type tensor<2x3xf64>, but has been previously used or defined with type tensor<2x3xf32>{{$}}
// TYPES-NOT: {{.}}

// COUNT-NOT: Traceback
// COUNT: {{^.*}}operand_count.mlir:2:18: error: Expected ','{{$}}
// COUNT-NOT: {{.}}

// COUNT-GENERIC-NOT: Traceback
// COUNT-GENERIC: {{^.*}}operand_count_generic.mlir:3:3: error: 'ad.add' {{.*}}operand{{.*}}
// COUNT-GENERIC-NOT: {{.}}

// VERIFY-NOT: Traceback
// VERIFY: {{^.*}}verify_error.mlir:2:3: error: 'ad.add' operand shapes 2x3, 4x3 do not broadcast{{$}}
// VERIFY-NOT: {{.}}

// PASS: ad-opt: error: Unrecognized passes: ['bogus']{{$}}
// PASS-NOT: {{.}}

// MISSING: ad-opt: error: [Errno 2] No such file or directory: '{{.*}}does_not_exist.mlir'{{$}}
// MISSING-NOT: {{.}}

// CONFIG: ad-opt: error: hidden_size 48 must be a multiple of 2 * head_dim (64){{$}}
// CONFIG-NOT: {{.}}
