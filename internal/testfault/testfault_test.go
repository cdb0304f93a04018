package testfault

import "testing"

// A binary not linked with enabled=yes (this test's own, like a release
// build) ignores the variable.
func TestInertWithoutTheLinkerFlag(t *testing.T) {
	t.Setenv(Env, KillAfterHECiphertext)
	if Armed(KillAfterHECiphertext) {
		t.Fatal("a binary built without the test linker flag honours " + Env)
	}
	enabled = "yes"
	defer func() { enabled = "" }()
	if !Armed(KillAfterHECiphertext) || Armed("another-point") {
		t.Fatal("a test build does not arm exactly the named point")
	}
}
