package he

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/scellis/scellis/secagg"
)

// testRound builds params for n generated sites.
func testRound(t testing.TB, n, dim int, bound int64) (Params, []ed25519.PrivateKey) {
	t.Helper()
	p := Params{Round: fmt.Sprintf("he-test-%d-%d", n, dim), Dim: dim, Bound: bound, Seed: make([]byte, 32)}
	rand.Read(p.Seed)
	keys := make([]ed25519.PrivateKey, n)
	for i := range n {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = priv
		p.Members = append(p.Members, secagg.Member{ID: fmt.Sprintf("site-%02d", i), Key: pub})
	}
	return p, keys
}

// drive runs a round in memory through marshal and parse, as the network
// would: sites in dropAfterShare send no ciphertext; sites in
// dropAfterEncrypt never answer a decrypt request. view, when not nil,
// receives every byte string the aggregator is sent.
type drive struct {
	dropAfterShare, dropAfterEncrypt map[string]bool
	view                             func(kind, from string, b []byte)
	// onRequest, when set, sees each decrypt request and the parties
	// before the decryptors answer it (to play a lying aggregator).
	onRequest func(parties map[string]*Party, req *DecryptRequest, sent map[string]*Ciphertext)
}

func (d drive) run(t testing.TB, p Params, keys []ed25519.PrivateKey, inputs [][]int64) (*Result, error) {
	t.Helper()
	agg, err := NewAggregator(p)
	if err != nil {
		t.Fatal(err)
	}
	see := func(kind, from string, b []byte) {
		if d.view != nil {
			d.view(kind, from, b)
		}
	}
	parties := map[string]*Party{}
	for i, m := range p.Members {
		c, err := NewParty(p, m.ID, keys[i])
		if err != nil {
			t.Fatal(err)
		}
		parties[m.ID] = c
		a, err := c.Advertise()
		send(t, see, "advert", m.ID, ParseAdvert, agg.AddAdvert, a, err)
	}
	ks, err := agg.EndAdvertise()
	if err != nil {
		return nil, err
	}
	ksb := must(ks.Marshal())
	for _, m := range p.Members {
		sh, err := parties[m.ID].Share(must(ParseKeySet(ksb)))
		send(t, see, "shares", m.ID, ParseShares, agg.AddShares, sh, err)
	}
	dels, err := agg.EndShare()
	if err != nil {
		return nil, err
	}
	sent := map[string]*Ciphertext{}
	for i, m := range p.Members {
		if d.dropAfterShare[m.ID] {
			continue
		}
		var del *Delivery
		for _, x := range dels {
			if x.To == m.ID {
				del = must(ParseDelivery(must(x.Marshal())))
			}
		}
		ct, err := parties[m.ID].Encrypt(del, inputs[i])
		send(t, see, "ciphertext", m.ID, ParseCiphertext, agg.AddCiphertext, ct, err)
		sent[m.ID] = ct
	}
	req, err := agg.EndEncrypt()
	for err == nil {
		if d.onRequest != nil {
			d.onRequest(parties, req, sent)
		}
		rb := must(req.Marshal())
		for _, s := range req.Decryptors {
			if d.dropAfterEncrypt[s] {
				continue
			}
			ds, err := parties[s].Decrypt(must(ParseDecryptRequest(rb)))
			if err != nil && d.onRequest != nil {
				continue // a site the lying aggregator made abort: it no longer answers
			} else if err != nil {
				t.Fatal(err)
			}
			send(t, see, "decrypt share", s, ParseDecryptShare, agg.AddDecryptShare, ds, nil)
		}
		var res *Result
		if res, req, err = agg.EndDecrypt(); res != nil {
			return res, nil
		}
	}
	return nil, err
}

// send carries a site's message m of kind to the aggregator as the wire
// would: marshalled (the bytes shown to see), parsed back, handed to add.
// err is the site's error making m, which fails the test.
func send[M interface{ Marshal() ([]byte, error) }](t testing.TB, see func(kind, from string, b []byte), kind, from string, parse func([]byte) (M, error), add func(M) error, m M, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	b := must(m.Marshal())
	see(kind, from, b)
	if err := add(must(parse(b))); err != nil {
		t.Fatal(err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
