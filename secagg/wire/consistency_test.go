package wire

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/secagg"
)

// TestEquivocatingHostRefused runs four real sites (Participate, mutual
// TLS on a loopback port) against a hostile aggregator: the real Host
// behind a middleware that equivocates about one site's dropout. It shows
// hospital-a and hospital-c a survivor set in which hospital-b dropped out
// (so they would reveal shares of b's mask key) and hospital-b and
// hospital-d the true set (so they would reveal shares of b's self-mask
// seed): with both, the aggregator could unmask b's input. It collects
// every site's signature itself and hands each the best proof it has:
// two valid signatures of the set the site signed, plus — to reach the
// threshold of 3 — a signature made over the other set (a, b, c), or only
// the two (d). Every site must refuse before revealing anything: SC6018
// for a signature that does not verify over its set, SC6004 for too few
// signatures; and no unmasking may reach the aggregator.
func TestEquivocatingHostRefused(t *testing.T) {
	t.Parallel()
	const dim = 64
	w, th, p := openRound(t, 4, "equivocate", dim, nil)
	const victim = "hospital-b"
	fakeView := map[string]bool{"hospital-a": true, "hospital-c": true}

	var (
		mu        sync.Mutex
		trueSet   *secagg.UnmaskRequest
		fakeSet   *secagg.UnmaskRequest
		collected = map[string]*secagg.SurvivorSig{}
		allSigned = make(chan struct{})
	)
	reply := func(rw http.ResponseWriter, status int, body []byte) {
		rw.Header().Set("Content-Type", contentCBOR)
		rw.WriteHeader(status)
		rw.Write(body)
	}
	th.mu.Lock()
	th.hostile = func(rw http.ResponseWriter, r *http.Request, body []byte) bool {
		peer, ok := w.fed.PeerFromRequest(r)
		if !ok {
			return false
		}
		site := peer.Name
		switch {
		case r.Method == http.MethodGet && endpoint(r, "survivors"):
			// Let the real host answer, then show some sites another set.
			rec := httptest.NewRecorder()
			th.Host.ServeHTTP(rec, r)
			if rec.Code != http.StatusOK {
				for k, v := range rec.Header() {
					rw.Header()[k] = v
				}
				rw.WriteHeader(rec.Code)
				rw.Write(rec.Body.Bytes())
				return true
			}
			set, err := secagg.ParseUnmaskRequest(rec.Body.Bytes())
			if err != nil {
				t.Errorf("the host's survivor set: %v", err)
				return false
			}
			fake := &secagg.UnmaskRequest{Round: set.Round,
				Survivors: slices.DeleteFunc(slices.Clone(set.Survivors), func(s string) bool { return s == victim }),
				Dropped:   append(slices.Clone(set.Dropped), victim)}
			mu.Lock()
			trueSet, fakeSet = set, fake
			mu.Unlock()
			out := set
			if fakeView[site] {
				out = fake
			}
			b, err := out.Marshal()
			if err != nil {
				t.Error(err)
			}
			reply(rw, http.StatusOK, b)
			return true
		case r.Method == http.MethodPost && endpoint(r, "signature"):
			sig, err := secagg.ParseSurvivorSig(body)
			if err != nil || sig.From != site {
				t.Errorf("signature from %s: %v", site, err)
				return false
			}
			mu.Lock()
			if collected[site] == nil {
				collected[site] = sig
				if len(collected) == len(w.silos) {
					close(allSigned)
				}
			}
			mu.Unlock()
			rw.WriteHeader(http.StatusNoContent)
			return true
		case r.Method == http.MethodGet && endpoint(r, "unmask"):
			select {
			case <-allSigned:
			case <-r.Context().Done():
				return true
			}
			mu.Lock()
			defer mu.Unlock()
			sigOf := func(s string) secagg.Signature { return secagg.Signature{Of: s, Sig: collected[s].Sig} }
			var req *secagg.UnmaskRequest
			switch site {
			case "hospital-a", "hospital-c": // a's and c's own signatures, and d's over the true set
				req = &secagg.UnmaskRequest{Round: fakeSet.Round, Survivors: fakeSet.Survivors, Dropped: fakeSet.Dropped,
					Signatures: []secagg.Signature{sigOf("hospital-a"), sigOf("hospital-c"), sigOf("hospital-d")}}
			case "hospital-b": // b's and d's, and a's over the other set
				req = &secagg.UnmaskRequest{Round: trueSet.Round, Survivors: trueSet.Survivors, Dropped: trueSet.Dropped,
					Signatures: []secagg.Signature{sigOf("hospital-a"), sigOf("hospital-b"), sigOf("hospital-d")}}
			default: // only the two honest signatures of the true set
				req = &secagg.UnmaskRequest{Round: trueSet.Round, Survivors: trueSet.Survivors, Dropped: trueSet.Dropped,
					Signatures: []secagg.Signature{sigOf("hospital-b"), sigOf("hospital-d")}}
			}
			b, err := req.Marshal()
			if err != nil {
				t.Error(err)
			}
			reply(rw, http.StatusOK, b)
			return true
		}
		return false
	}
	th.mu.Unlock()

	ctx := t.Context()
	runs, _ := startSites(ctx, w, th, p, w.silos, rising(1), nil)
	want := map[string]diag.Code{"hospital-a": diag.SecAggEquivocation, "hospital-b": diag.SecAggEquivocation,
		"hospital-c": diag.SecAggEquivocation, "hospital-d": diag.SecAggBelowThreshold}
	for _, r := range runs {
		wantCode(t, r.site, r.wait(t), want[r.site])
	}
	th.mu.Lock()
	for _, rec := range th.bodies {
		if rec.method == http.MethodPost && strings.HasSuffix(rec.path, "/unmasking") {
			t.Errorf("an unmasking reached the equivocating aggregator: %s", rec.path)
		}
	}
	th.mu.Unlock()
	th.Abort(p.Round, "the test is over")
	if _, err := th.Wait(ctx, p.Round); err == nil {
		t.Error("the aborted round produced a sum")
	}
}
