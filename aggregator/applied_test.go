package aggregator

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/coordinator"
	"github.com/scellis/scellis/diag"
)

// The outcome of an applied command is written without re-encoding its
// response (encodeResponse) and read back without decoding it again
// (decodeApplied): the bytes must be those json.Marshal writes for the
// api.Applied, and reading them must give what json.Unmarshal gives, for
// responses and refusals alike.
func TestAppliedEncodingMatchesJSON(t *testing.T) {
	responses := []any{
		coordinator.ReportResponse{Shard: 2, Peer: "w<&>1", Late: true},
		&coordinator.BatchResponse{Results: []coordinator.Result{{Response: coordinator.CommitResponse{}}, {Refusal: diag.List{diag.New(diag.PoolBadRequest, "s", "no <way>")}}}},
		[]int{1, 2},
		"a string",
		42,
		map[string]any{},
		nil,
	}
	for _, v := range responses {
		resp, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		want := encodeApplied(api.Applied{Response: resp})
		got := encodeResponse(resp)
		if string(got) != string(want) {
			t.Errorf("%T: encodeResponse wrote %s, json.Marshal %s", v, got, want)
		}
		checkDecode(t, got)
	}
	checkDecode(t, encodeApplied(api.Applied{Refusal: diag.List{diag.New(diag.PoolBadCommand, "command", "bad {response}")}}))
}

func checkDecode(t *testing.T, b []byte) {
	t.Helper()
	var want api.Applied
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	got, err := decodeApplied(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decodeApplied(%s) = %+v, json.Unmarshal %+v", b, got, want)
	}
}
