package script

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"go.starlark.net/starlark"

	"github.com/scellis/scellis/diag"
)

// The rng module gives content deterministic randomness for simulations:
// ChaCha8 (math/rand/v2) keyed by SHA-256 of Env.Seed (the shard ID), so a
// shard draws the same numbers on every peer. It is not a source of DP
// noise or of secrets: those come from crypto/rand in package dp.
//
// rng.stream(n) returns an independent generator keyed by an integer, for
// content that needs the same numbers in every shard (the matrices of the
// matmul program, for instance).

// generator is a seeded stream; as a Starlark value it is what
// rng.stream(n) returns, with the module's functions as methods.
type generator struct {
	r    *rand.Rand
	name string
}

func newGenerator(key [32]byte, name string) *generator {
	return &generator{r: rand.New(rand.NewChaCha8(key)), name: name}
}

// rngFuncs are the generator's operations, shared by the module (on the
// call's shard-seeded generator) and by stream objects.
var rngFuncs = map[string]func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error){
	"uniform": func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var lo, hi num = 0, 1
		if err := unpack(name, args, kw, "lo?", &lo, "hi?", &hi); err != nil {
			return nil, err
		}
		if !(lo < hi) || !finite(float64(lo)) || !finite(float64(hi)) {
			return nil, fmt.Errorf("need finite lo < hi, got [%v, %v)", lo, hi)
		}
		return starlark.Float(float64(lo) + float64(float64(hi-lo)*g.r.Float64())), nil
	},
	"normal": func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var mu, sigma num = 0, 1
		if err := unpack(name, args, kw, "mu?", &mu, "sigma?", &sigma); err != nil {
			return nil, err
		}
		if !(sigma >= 0) || !finite(float64(mu)) || !finite(float64(sigma)) {
			return nil, fmt.Errorf("need finite mu and sigma ≥ 0, got %v and %v", mu, sigma)
		}
		return starlark.Float(float64(mu) + float64(float64(sigma)*normal(g.r))), nil
	},
	"int": func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var n int
		if err := unpack(name, args, kw, "n", &n); err != nil {
			return nil, err
		}
		if n <= 0 {
			return nil, fmt.Errorf("n must be positive, got %d", n)
		}
		return starlark.MakeInt64(g.r.Int64N(int64(n))), nil
	},
	"uniforms": func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var n int
		if err := unpack(name, args, kw, "n", &n); err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, fmt.Errorf("n must not be negative, got %d", n)
		}
		v, err := st.newOwnedVector(n, name)
		if err != nil {
			return nil, err
		}
		for i := range v {
			v[i] = g.r.Float64()
		}
		return newVector(v), nil
	},
	"normals": func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var n int
		if err := unpack(name, args, kw, "n", &n); err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, fmt.Errorf("n must not be negative, got %d", n)
		}
		v, err := st.newOwnedVector(n, name)
		if err != nil {
			return nil, err
		}
		for i := range v {
			v[i] = normal(g.r)
		}
		return newVector(v), nil
	},
	"shuffle": func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var l *starlark.List
		if err := unpack(name, args, kw, "list", &l); err != nil {
			return nil, err
		}
		n := l.Len()
		if err := st.reserve(uint64(n)*slotBytes, name); err != nil {
			return nil, err
		}
		elems := make([]starlark.Value, n)
		for i := range elems {
			elems[i] = l.Index(i)
		}
		g.r.Shuffle(n, func(i, j int) { elems[i], elems[j] = elems[j], elems[i] })
		for i, e := range elems {
			if err := l.SetIndex(i, e); err != nil {
				return nil, err
			}
		}
		return starlark.None, nil
	},
	"choice": func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var seq starlark.Indexable
		if err := unpack(name, args, kw, "seq", &seq); err != nil {
			return nil, err
		}
		if seq.Len() == 0 {
			return nil, fmt.Errorf("choice from an empty sequence")
		}
		return seq.Index(g.r.IntN(seq.Len())), nil
	},
	"seed": func(st *callState, g *generator, name string, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		if err := unpack(name, args, kw); err != nil {
			return nil, err
		}
		return starlark.MakeUint64(g.r.Uint64() >> 1), nil
	},
}

var rngModule = func() starlark.Value {
	fns := map[string]nativeFunc{}
	for name, f := range rngFuncs {
		full := "rng." + name
		fns[name] = func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
			g, err := st.shardRNG()
			if err != nil {
				return nil, err
			}
			return f(st, g, full, args, kw)
		}
	}
	fns["stream"] = func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		var n int64
		if err := unpack("rng.stream", args, kw, "seed", &n); err != nil {
			return nil, err
		}
		return newGenerator(streamKey(n), fmt.Sprintf("rng.stream(%d)", n)), nil
	}
	return makeModule("rng", fns)
}()

const streamDomain = "scellis/rng/stream\x00"

// streamKey is the ChaCha8 key of rng.stream(n): SHA-256 of a domain
// string and n, big-endian.
func streamKey(n int64) [32]byte {
	var buf [len(streamDomain) + 8]byte
	copy(buf[:], streamDomain)
	binary.BigEndian.PutUint64(buf[len(streamDomain):], uint64(n))
	return sha256.Sum256(buf[:])
}

// shardRNG is the call's generator keyed by Env.Seed, created on first use.
func (st *callState) shardRNG() (*generator, error) {
	if st.rng != nil {
		return st.rng, nil
	}
	if st.env.Seed == nil {
		return nil, diag.New(diag.NativeArgument, "rng", "this call has no seed, so the rng module is unavailable").
			WithHelp("the engine seeds rng for shard programs; elsewhere use rng.stream(n) for a generator keyed by n")
	}
	st.rng = newGenerator(sha256.Sum256(st.env.Seed), "rng")
	return st.rng, nil
}

var _ starlark.HasAttrs = (*generator)(nil)

func (g *generator) String() string        { return "<" + g.name + ">" }
func (g *generator) Type() string          { return "rng" }
func (g *generator) Freeze()               {}
func (g *generator) Truth() starlark.Bool  { return true }
func (g *generator) Hash() (uint32, error) { return 0, fmt.Errorf("unhashable type: rng") }
func (g *generator) AttrNames() []string {
	names := make([]string, 0, len(rngFuncs))
	for n := range rngFuncs {
		names = append(names, n)
	}
	return names
}
func (g *generator) Attr(name string) (starlark.Value, error) {
	f, ok := rngFuncs[name]
	if !ok {
		return nil, nil
	}
	full := g.name + "." + name
	return native("rng", name, func(st *callState, args starlark.Tuple, kw []starlark.Tuple) (starlark.Value, error) {
		return f(st, g, full, args, kw)
	}), nil
}
