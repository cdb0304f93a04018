package aggregator

import (
	"context"
	"errors"
	"testing"

	"github.com/scellis/scellis/coordinator"
)

// A round attempt's plain outcomes need no proposal: nothing to do until
// the next pass ends the attempt quietly, any other error is returned as
// it is, and an attempt that never opened its sum aborts nothing when its
// leadership ends. (The retry and fault proposals are driven end to end
// by TestRunRoundTooFewSurvivorsRetriesPausesResumes and
// TestRunFaultPauseWaitsForAPerson.)
func TestRoundRunPlainOutcomes(t *testing.T) {
	rr := &roundRun{st: coordinator.RunStatus{}} // no node: a proposal would panic
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rr.finish(ctx, nil); err != nil {
		t.Errorf("a completed round ended with %v", err)
	}
	if err := rr.finish(ctx, errNextPass); err != nil {
		t.Errorf("nothing to do until the next pass ended with %v", err)
	}
	other := errors.New("not committed")
	if err := rr.finish(ctx, other); err != other {
		t.Errorf("a plain error came back as %v", err)
	}
	for _, e := range []error{roundStop{"r"}, roundRetry{reason: "r"}, roundFault{reason: "r"}} {
		if errors.Is(e, errNextPass) || e.Error() == "" {
			t.Errorf("%T reads as %q", e, e.Error())
		}
	}
	rr.close(ctx) // never opened: nothing to abort
}
