package diag

// Trainers: a data scientist's own training program run in a silo's
// sandbox (SC95xx). Every failure of a trainer is a clean decline: the
// silo charges nothing and the round goes on without it.
var (
	TrainerBad        = define("SC9501", "trainer directory cannot be used")
	TrainerNotAllowed = define("SC9502", "trainer not allowed by the silo's policy")
	TrainerCrashed    = define("SC9503", "trainer exited with an error")
	TrainerTimeout    = define("SC9504", "trainer ran past its wall-clock limit")
	TrainerMemory     = define("SC9505", "trainer exceeded its memory limit")
	TrainerCPU        = define("SC9506", "trainer exceeded its CPU-time limit")
	TrainerOutput     = define("SC9507", "trainer's output is missing, malformed or of the wrong shape")
	TrainerNonFinite  = define("SC9508", "trainer returned NaN or infinite weights")
	TrainerSandbox    = define("SC9509", "trainer sandbox cannot be set up")
	TrainerUnit       = define("SC9510", "trainer run asks for record-level DP")
	TrainerStrategy   = define("SC9511", "trainer run's strategy needs more than trained weights")
	TrainerNoExport   = define("SC9512", "trainer provides no ONNX export")
)
