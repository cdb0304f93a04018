//go:build !unix

package safefile

// nonBlock is 0 where FIFOs cannot be opened non-blocking; the descriptor
// check after the open still refuses anything but a regular file.
const nonBlock = 0
