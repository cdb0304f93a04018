package coordinator

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/trust"
)

func sampleCommands() []Command {
	ref := func(s string) content.Ref { return content.Hash([]byte(s)) }
	sub := SubmitJob{
		Job: ref("j"), Name: "sweep", Regime: trust.Open, Inputs: []trust.Item{{Name: "d", Class: trust.Public}},
		Policy: Policy{Replicas: 2, Attempts: 5, LeaseTTL: 100},
		Shards: []ShardPlan{{Index: 0, ID: ref("s0"), Price: 3, PriceBasis: "program cost()"}},
		Now:    5,
	}
	single := []Command{
		sub,
		Lease{Peer: "w1", Now: 1, TTL: 2, Max: 3, Job: ref("j"), RequestID: "r"},
		RenewLease{Peer: "w1", Job: ref("j"), Shard: 0, Now: 3, TTL: 4},
		ReleaseLeases{Peer: "w1", Now: 5, Shards: []ShardRef{{Job: ref("j"), Shard: 0}}},
		ReleaseLeases{Peer: "w1", Now: 5},
		Tick{Now: 9},
		ReportResult{Peer: "w1", Job: ref("j"), Shard: 0, Result: ref("r"), Now: 6},
		ReportReduced{Job: ref("j"), Peer: "agg", Reduced: ref("red"), Now: 7},
	}
	return append(single, Batch{Commands: single}, Batch{Commands: []Command{}})
}

func TestCommandEncodingRoundTrip(t *testing.T) {
	for _, c := range sampleCommands() {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatalf("%T: %v", c, err)
		}
		got, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("%T: %v", c, err)
		}
		again, _ := EncodeCommand(got)
		if !bytes.Equal(b, again) {
			t.Fatalf("%T: re-encoding differs", c)
		}
		if reflect.TypeOf(got) != reflect.TypeOf(c) {
			t.Fatalf("decoded %T, want %T", got, c)
		}
		// Pointers encode like values.
		p := reflect.New(reflect.TypeOf(c))
		p.Elem().Set(reflect.ValueOf(c))
		if pb, err := EncodeCommand(p.Interface().(Command)); err != nil || !bytes.Equal(pb, b) {
			t.Fatalf("*%T encodes differently: %v", c, err)
		}
	}
}

func TestDecodeCommandRefusesMalformed(t *testing.T) {
	nested, _ := content.Encode(map[string]any{"batch": []any{map[string]any{"batch": []any{}}}})
	two, _ := content.Encode(map[string]any{"tick": map[string]any{"now": 1}, "lease": map[string]any{"peer": "w"}})
	unknown, _ := content.Encode(map[string]any{"tick": map[string]any{"now": 1, "extra": 2}})
	for name, b := range map[string][]byte{
		"empty": nil, "garbage": []byte("{"), "no command": {0xa0},
		"two commands": two, "nested batch": nested, "unknown field": unknown,
	} {
		_, err := DecodeCommand(b)
		ds, ok := diag.As(err)
		if !ok || ds[0].Code != diag.PoolBadCommand {
			t.Errorf("%s: got %v, want SC7006", name, err)
		}
	}
	if _, err := EncodeCommand(Batch{Commands: []Command{Batch{}}}); err == nil {
		t.Error("a nested batch encoded")
	}
	m, _ := New(Config{Regime: trust.Own})
	if r := m.Apply(Batch{Commands: []Command{Batch{}}}); r.Response.(*BatchResponse).Results[0].Refusal[0].Code != diag.PoolBadCommand {
		t.Error("a nested batch applied")
	}
	if r := m.Apply((*Tick)(nil)); !r.Refused() {
		t.Error("a nil command applied")
	}
}

// FuzzDecodeCommand: whatever DecodeCommand accepts, EncodeCommand gives
// back byte for byte, and applying it to a machine never panics.
func FuzzDecodeCommand(f *testing.F) {
	n := 0
	for _, c := range sampleCommands() {
		b, err := EncodeCommand(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		n++
	}
	if n == 0 {
		f.Fatal("no seeds")
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			return
		}
		again, err := EncodeCommand(c)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("round trip not exact: %v\n in %x\nout %x", err, b, again)
		}
		m, _ := New(Config{Regime: trust.Open})
		m.Apply(c)
		if _, err := Load(m.Snapshot()); err != nil {
			t.Fatalf("state after %T does not restore: %v", c, err)
		}
	})
}

// Law 3: the coordinator handles result hashes, never result bytes. No
// command, response or event carries a byte slice, but for a peer's
// signature (Sig: refused on apply unless it is one verifying 64-byte
// Ed25519 signature, signed.go).
func TestNoResultBytesInTheAPI(t *testing.T) {
	types := []any{
		SubmitJob{}, Lease{}, RenewLease{}, ReleaseLeases{}, Tick{}, ReportResult{}, ReportReduced{},
		SubmitResponse{}, LeaseResponse{}, RenewResponse{}, ReleaseResponse{}, TickResponse{}, ReportResponse{},
		ReducedResponse{}, JobStatus{}, PeerRecord{},
		JobSubmitted{}, ShardLeased{}, LeaseEnded{}, ResultReported{}, ShardVerified{}, ShardFlagged{},
		AllShardsDecided{}, JobComplete{},
	}
	seen := map[reflect.Type]bool{}
	var walk func(path string, ty reflect.Type)
	walk = func(path string, ty reflect.Type) {
		if seen[ty] {
			return
		}
		seen[ty] = true
		switch ty.Kind() {
		case reflect.Slice, reflect.Array:
			if ty.Elem().Kind() == reflect.Uint8 && !strings.HasSuffix(path, ".Sig") {
				t.Errorf("%s is a byte slice", path)
			}
			walk(path+"[]", ty.Elem())
		case reflect.Pointer, reflect.Map:
			walk(path+"*", ty.Elem())
		case reflect.Interface:
			if ty.NumMethod() == 0 {
				t.Errorf("%s is an untyped interface that could carry bytes", path)
			}
		case reflect.Struct:
			for i := 0; i < ty.NumField(); i++ {
				walk(path+"."+ty.Field(i).Name, ty.Field(i).Type)
			}
		}
	}
	for _, v := range types {
		walk(reflect.TypeOf(v).Name(), reflect.TypeOf(v))
	}
	if !seen[reflect.TypeOf(ReportResult{})] {
		t.Fatal("ReportResult was not walked")
	}
}
