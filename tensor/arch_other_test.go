//go:build !amd64

package tensor

const gonumDoesNotFuse = false
