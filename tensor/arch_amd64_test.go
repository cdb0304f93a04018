package tensor

// gonumDoesNotFuse: on amd64 gonum's kernels are assembly that rounds each
// product (no FMA), so MatMul must reproduce them exactly.
const gonumDoesNotFuse = true
