package script

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// endlessTraining is the model.train(epochs=10**12).
const endlessTraining = `
def f(d):
    return model.train(data = d, epochs = 1000000000000).params()
`

func smallDataset(t *testing.T) *model.Dataset {
	t.Helper()
	d, err := model.ParseCSV(strings.NewReader("x1,x2,y\n1,2,0\n2,1,1\n3,3,0\n0,1,1\n"), "d", "y")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Long natives charge their work to the step budget as they go.
func TestLongNativesSpendTheStepBudget(t *testing.T) {
	d := smallDataset(t)
	env := Env{Limits: Limits{Steps: 100_000}}
	_, err := Call(context.Background(), env, entry(t, "prog.star", endlessTraining), "f", d)
	wantDiag(t, err, diag.StepBudget)

	mm := `
def f():
    a = tensor.reshape(tensor.ones(360000), 600, 600)
    for i in range(1000000):
        a = tensor.matmul(a, a)
    return 0
`
	_, err = Call(context.Background(), env, entry(t, "prog.star", mm), "f")
	wantDiag(t, err, diag.StepBudget)
}

// Cancelling the context (a worker's shard timeout, SIGINT) stops a native
// in the middle of its loop.
func TestLongNativesHonourCancellation(t *testing.T) {
	d := smallDataset(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	started := make(chan struct{})
	env := Env{Limits: Limits{Steps: 1 << 62}, Print: func(string) { close(started) }}
	src := strings.Replace(endlessTraining, "    return", "    print(\"training\")\n    return", 1)
	done := make(chan error, 1)
	go func() {
		_, err := Call(ctx, env, entry(t, "prog.star", src), "f", d)
		done <- err
	}()
	<-started // the call is running; model.train is next
	cancel(errors.New("shard timeout"))
	select {
	case err := <-done:
		d := wantDiag(t, err, diag.ContentCancelled)
		if !strings.Contains(d.Message, "shard timeout") || strings.Contains(d.Message, "not started") {
			t.Fatalf("message %q", d.Message)
		}
	case <-time.After(time.Minute): // a hang detector, not a timing assertion
		t.Fatal("model.train ignored cancellation")
	}
}
