package wire

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/secagg/transport"
)

// TestKeysBeforeInput: four silos exchange their keys before their inputs
// exist (ParticipateBeforeInput, as a silo does while it trains and
// charges): each is asked for its input only once every advert and every
// share reached the host and none of the inputs did; the mask phase,
// whose own deadline has passed by then, still waits for them (TrainInMask:
// it has what the advertise phase left); one silo gives no input (it
// declined after sharing its keys) and drops out, excused, and the sum
// is the three others'.
func TestKeysBeforeInput(t *testing.T) {
	t.Parallel()
	const dim, maskDeadline = 64, 10 * time.Millisecond
	w, th, p := openRound(t, 4, "keys-before-input", dim, func(dl *Deadlines) {
		dl.Mask = maskDeadline
		dl.TrainInMask = true
	})
	ctx := t.Context()
	asked := make(chan string, len(w.silos))
	give := make(chan struct{})
	errDeclined := errors.New("test: the silo declined after sharing its keys")
	type result struct {
		site string
		err  error
	}
	done := make(chan result, len(w.silos))
	var xs [][]float64
	for i, s := range w.silos {
		x := testInput(s, dim)
		if s != "hospital-d" {
			xs = append(xs, x)
		}
		tr := transport.HTTPS{Client: w.silo(s), Base: th.url}
		go func() {
			err := ParticipateBeforeInput(ctx, tr, p, w.keys[s], 3, func(ctx context.Context) (Input, error) {
				asked <- s
				select {
				case <-give:
				case <-ctx.Done():
					return Input{}, ctx.Err()
				}
				if s == "hospital-d" {
					return Input{}, errDeclined
				}
				return Input{Values: x, Weight: float64(i + 1), MinSurvivors: 99}, nil // MinSurvivors: ignored here
			})
			done <- result{s, err}
		}()
	}
	for range w.silos {
		select {
		case <-asked:
		case <-time.After(30 * time.Second):
			t.Fatal("a silo was not asked for its input")
		}
	}
	th.mu.Lock()
	sent := map[string]int{}
	for _, b := range th.bodies {
		if b.method == http.MethodPost {
			sent[b.path[strings.LastIndex(b.path, "/")+1:]]++
		}
	}
	th.mu.Unlock()
	if sent["advert"] != 4 || sent["shares"] != 4 || sent["masked"] != 0 {
		t.Fatalf("before any input was given the host received %v, want 4 adverts, 4 shares, no masked input", sent)
	}
	// The mask phase's own deadline passes before any input is given.
	time.Sleep(5 * maskDeadline)
	close(give)
	for range w.silos {
		select {
		case r := <-done:
			if r.site == "hospital-d" {
				if !errors.Is(r.err, errDeclined) {
					t.Errorf("hospital-d: %v, want its own error", r.err)
				}
				th.Excuse(p.Round, "hospital-d")
			} else if r.err != nil {
				t.Errorf("%s: %v", r.site, r.err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("a silo's part did not end")
		}
	}
	res := th.sum(t, ctx, p.Round)
	checkSum(t, res, plainSum(dim, xs...), 1+2+3, []string{"hospital-a", "hospital-b", "hospital-c"}, []string{"hospital-d"})
}
