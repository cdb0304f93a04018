// Package archmap holds no code: its test holds docs/architecture.md, the
// map of the module, to the module. Every package, file and test the page
// names must exist, every package of the module must stand on one of its
// floors, and no package may import one on a higher floor.
//
// It imports nothing of the module (its test reads the sources as text).
package archmap
