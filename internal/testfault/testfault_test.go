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

// Fires fires once per marker, across processes (a file), and only for
// the named job.
func TestFiresOncePerMarker(t *testing.T) {
	enabled = "yes"
	defer func() { enabled = "" }()
	marker := t.TempDir() + "/fired"
	t.Setenv(Env, BadOuterKey+":round-1:"+marker)
	if Fires(BadOuterKey, "round-2") || Fires(ForgeRoundBundle, "round-1") {
		t.Fatal("a fault fired for another job or point")
	}
	if !Fires(BadOuterKey, "round-1") {
		t.Fatal("the armed fault did not fire")
	}
	if Fires(BadOuterKey, "round-1") {
		t.Fatal("the fault fired twice on one marker")
	}
}
