// Package trainer runs a data scientist's own training program (a
// "trainer": a directory of Python files with an entry point) inside a
// silo, in a sandbox, and exchanges weights with it through files numpy
// alone can read and write.
//
// A trainer is content: Load reads its directory into a Bundle, whose
// canonical encoding is shipped as a blob and whose hash (Bundle.Ref) is
// what a run names and a silo's policy allows. The bundle carries the
// model's initial weights (init.npy) and their layout (layout.json), so the
// aggregator can size the secure sum and start the run without running
// any Python.
//
// Run (sandbox_linux.go) executes one mode of a trainer (init, train or
// evaluate) as a child process in new user, mount, network, PID, IPC and
// UTS namespaces, with a read-only view of the dataset file, the trainer
// and the system's software directories, a writable scratch directory and
// exchange directory, and CPU, memory, file-size and wall-clock limits.
// Every way a trainer can fail comes back as a diagnostic with its own
// code (SC95xx); the silo declines the round with it and charges nothing.
//
// Privacy is not the trainer's job: the silo clips, noises, charges and
// masks the update the trainer returns exactly as for a built-in model.
package trainer
