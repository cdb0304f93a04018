package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/receipt"
)

// decodeBoth runs decodeItems (one pass, falling back item by item) and
// decodeItemsByItem (the item-by-item reading alone) on body, and returns
// both outcomes: accepted, the items, the status and the refusal body.
func decodeBoth(t *testing.T, body string) (one, byItem decoded) {
	t.Helper()
	run := func(f func(http.ResponseWriter, *http.Request, string, *[]ResultReport) bool) decoded {
		r := httptest.NewRequest("POST", "/v1/results/batch", strings.NewReader(body))
		w := httptest.NewRecorder()
		r.Body = http.MaxBytesReader(w, r.Body, MaxBatchRequestBytes)
		var items []ResultReport
		ok := f(w, r, "reports", &items)
		return decoded{ok: ok, items: items, status: w.Code, refusal: w.Body.String()}
	}
	return run(decodeItems[ResultReport]), run(decodeItemsByItem[ResultReport])
}

type decoded struct {
	ok      bool
	items   []ResultReport
	status  int
	refusal string
}

// The one-pass decoding of a batch accepts exactly the bodies the
// item-by-item decoding accepts, with the same items, and refuses the
// others with the same answer (it falls back to it), so the diagnostic
// still names the malformed item.
func TestDecodeItemsOnePassAgreesWithItemByItem(t *testing.T) {
	job := content.Hash([]byte("job"))
	res := content.Hash([]byte("result"))
	item := func(shard int) string {
		return fmt.Sprintf(`{"job":%q,"shard":%d,"result":%q,"nonce":"ab","sig":"c2ln"}`, job, shard, res)
	}
	many := make([]string, MaxBatch+1)
	for i := range many {
		many[i] = item(i)
	}
	for _, c := range []struct {
		name, body string
		ok         bool
		mention    string // in the refusal
	}{
		{"one item", `{"reports":[` + item(0) + `]}`, true, ""},
		{"three items", `{"reports":[` + item(0) + `,` + item(1) + `,` + item(2) + "]}\n", true, ""},
		{"null item", `{"reports":[` + item(0) + `,null]}`, true, ""},
		{"unknown field in item 1", `{"reports":[` + item(0) + `,{"job":"` + string(job) + `","bogus":1}]}`, false, "reports[1]"},
		{"bad ref in item 2", `{"reports":[` + item(0) + `,` + item(1) + `,{"job":"sha256:xyz"}]}`, false, "reports[2]"},
		{"other key", `{"reports":[` + item(0) + `],"extra":[]}`, false, "nothing else"},
		{"wrong key", `{"commits":[` + item(0) + `]}`, false, "nothing else"},
		{"empty", `{"reports":[]}`, false, "1 to"},
		{"too many", `{"reports":[` + strings.Join(many, ",") + `]}`, false, "1 to"},
		{"too many, one malformed", `{"reports":[` + strings.Join(many, ",") + `,{"bogus":1}]}`, false, "1 to"},
		{"trailing data", `{"reports":[` + item(0) + `]} {}`, false, "trailing"},
		{"not JSON", `{"reports":[`, false, "malformed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			one, by := decodeBoth(t, c.body)
			if one.ok != c.ok {
				t.Fatalf("accepted = %v, want %v (%d %s)", one.ok, c.ok, one.status, one.refusal)
			}
			if !reflect.DeepEqual(one, by) {
				t.Fatalf("one pass and item by item differ:\n%+v\n%+v", one, by)
			}
			if !c.ok && (one.status != http.StatusBadRequest || !strings.Contains(one.refusal, c.mention)) {
				t.Fatalf("refusal %d %s, want 400 naming %q", one.status, one.refusal, c.mention)
			}
			if c.ok && (len(one.items) == 0 || one.items[0].Job != job || one.items[0].Result != res || string(one.items[0].Sig) != "sig") {
				t.Fatalf("items decoded as %+v", one.items)
			}
		})
	}
	// An oversized body is refused 413 either way.
	big := `{"reports":[` + item(0) + `],"pad":"` + strings.Repeat("x", MaxBatchRequestBytes) + `"}`
	if one, by := decodeBoth(t, big); one.ok || one.status != http.StatusRequestEntityTooLarge || by.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d / %d, want 413", one.status, by.status)
	}
}

// A batch whose every item became a command, in order, is answered with
// the machine's encoding of its coordinator.BatchResponse as is
// (applyBatch); that encoding must read as the BatchResponse clients
// decode, item for item.
func TestBatchResponseEncodesAsCoordinators(t *testing.T) {
	if !inOrder([]int{0, 1, 2}) || inOrder([]int{1, 2}) || inOrder([]int{0, 2}) || !inOrder(nil) {
		t.Fatal("inOrder")
	}
	refusal := diag.List{diag.New(diag.PoolBadRequest, "shard 1", "refused <because> & so")}
	machine := coordinator.BatchResponse{Results: []coordinator.Result{
		{Response: coordinator.ReportResponse{Shard: 3, Peer: "w<1>", Late: true}},
		{Refusal: refusal},
		{Response: coordinator.CommitResponse{}},
	}}
	b, err := json.Marshal(&machine)
	if err != nil {
		t.Fatal(err)
	}
	var got BatchResponse
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("the machine's batch answer does not decode as a BatchResponse: %v", err)
	}
	if len(got.Results) != 3 {
		t.Fatalf("%d items", len(got.Results))
	}
	for i, r := range machine.Results {
		want := BatchItem{Refusal: r.Refusal}
		if r.Response != nil {
			if want.Response, err = json.Marshal(r.Response); err != nil {
				t.Fatal(err)
			}
		}
		wb, _ := json.Marshal(want)
		gb, _ := json.Marshal(got.Results[i])
		if string(wb) != string(gb) {
			t.Errorf("item %d reads as %s, want %s", i, gb, wb)
		}
	}
}

// A full batch of reports signed as one (receipt/batch.go: one signature,
// each report with its path in a tree of MaxBatch leaves) fits the batch
// endpoint's body limit, with every field at its largest.
func TestFullSignedReportBatchFits(t *testing.T) {
	leaves := make([][32]byte, MaxBatch)
	for i := range leaves {
		leaves[i] = receipt.StatementLeaf(receipt.Statement{Job: content.Hash([]byte("j")), Shard: i, Result: content.Hash([]byte{byte(i)}), Tier: receipt.TierConvergent, Peer: "worker-with-a-long-name"})
	}
	_, paths := receipt.BatchTree(leaves)
	var b ReportBatch
	for i := range MaxBatch {
		b.Reports = append(b.Reports, ResultReport{
			Job: content.Hash([]byte("j")), Shard: 1<<31 - 1 - i, Result: content.Hash([]byte{byte(i)}),
			Nonce: strings.Repeat("f", 2*coordinator.NonceBytes), Sig: make([]byte, 64), Path: paths[i],
		})
	}
	body, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) > MaxBatchRequestBytes {
		t.Fatalf("a full batch of signed reports is %d bytes, over the limit of %d", len(body), MaxBatchRequestBytes)
	}
	t.Logf("a full batch of signed reports: %d bytes of %d", len(body), MaxBatchRequestBytes)
}
