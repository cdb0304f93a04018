package secagg_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"

	"github.com/scellis/scellis/secagg"
)

// Three hospitals sum their vectors; the aggregator sees only the sum.
// In a federation the messages travel over the network (Marshal and the
// Parse functions give their bytes); here they are passed in memory.
func Example() {
	ids := []string{"hospital-a", "hospital-b", "hospital-c"}
	keys := map[string]ed25519.PrivateKey{}
	p := secagg.Params{Round: "round-1", Dim: 3, Clip: 10, PRG: secagg.DefaultPRG()}
	for _, id := range ids {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		keys[id] = priv
		p.Members = append(p.Members, secagg.Member{ID: id, Key: pub})
	}
	inputs := map[string][]float64{
		"hospital-a": {1.5, -2, 0.25},
		"hospital-b": {-0.5, 4, 0},
		"hospital-c": {1, 1, -9.75},
	}

	server, err := secagg.NewServer(p)
	if err != nil {
		panic(err)
	}
	clients := map[string]*secagg.Client{}
	for _, id := range ids {
		if clients[id], err = secagg.NewClient(p, id, keys[id]); err != nil {
			panic(err)
		}
	}
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}

	// 1. Advertise keys.
	for _, id := range ids {
		a, err := clients[id].Advertise()
		must(err)
		must(server.AddAdvert(a))
	}
	keySet, err := server.EndAdvertise()
	must(err)
	// 2. Share keys.
	for _, id := range ids {
		sh, err := clients[id].ShareKeys(keySet)
		must(err)
		must(server.AddShares(sh))
	}
	deliveries, err := server.EndShare()
	must(err)
	// 3. Send masked inputs.
	for _, d := range deliveries {
		m, err := clients[d.To].MaskInput(d, inputs[d.To], 0)
		must(err)
		must(server.AddMaskedInput(m))
	}
	set, err := server.EndMask()
	must(err)
	// 4. Sign the survivor set (the consistency round).
	for _, id := range set.Survivors {
		sig, err := clients[id].SignSurvivors(set)
		must(err)
		must(server.AddSignature(sig))
	}
	req, err := server.EndConsistency()
	must(err)
	// 5. Unmask, once the signatures show every survivor saw the same set.
	for _, id := range req.Survivors {
		u, err := clients[id].Unmask(req)
		must(err)
		must(server.AddUnmasking(u))
	}
	res, err := server.Finish()
	must(err)
	fmt.Println("sum:", res.Sum)
	fmt.Println("contributors:", res.Contributors)
	// Output:
	// sum: [2 3 -9.5]
	// contributors: [hospital-a hospital-b hospital-c]
}
