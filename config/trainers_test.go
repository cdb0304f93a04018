package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

const trainerSilo = `name: site-1
identity: keys/identity.key
federation: federation.yaml
data_dir: state
datasets:
  - name: cardio
    path: data/cardio.csv
    label: outcome
    class: confidential
    budget: {epsilon: 3, delta: 1e-5}
    unit: silo
policy:
  trainers:
    - name: cnn
      hash: sha256:8e3fae18545415ddc67ec597db12dffb0ab01d23b28ea5308624e69dcdb7483c
      interpreter: /bin/sh
      cpu_seconds: 60
      memory_mb: 2048
      wall: 90s
`

// policy.trainers: each trainer by content hash with its interpreter and
// limits; a hash that is not a ref, or an interpreter that is not an
// executable file, is refused at its line.
func TestLoadSiloTrainers(t *testing.T) {
	dir := writeFiles(t, map[string]string{"silo.yaml": trainerSilo, "data/cardio.csv": cardioCSV})
	c, err := LoadSilo(dir + "/silo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Trainer{Name: "cnn", Hash: "sha256:8e3fae18545415ddc67ec597db12dffb0ab01d23b28ea5308624e69dcdb7483c",
		Interpreter: "/bin/sh", CPUSeconds: 60, MemoryMB: 2048, Wall: 90 * time.Second}
	if len(c.Policy.Trainers) != 1 {
		t.Fatalf("trainers %+v", c.Policy.Trainers)
	}
	got := c.Policy.Trainers[0]
	if got.Pos.Line != 14 {
		t.Fatalf("the trainer's position is %+v, want line 14", got.Pos)
	}
	got.Pos = want.Pos
	if got != want {
		t.Fatalf("trainer %+v, want %+v", got, want)
	}

	bad := strings.NewReplacer("sha256:8e3f", "sha256:XX3f", "/bin/sh", "python3", "cpu_seconds: 60", "cpu_seconds: 0").Replace(trainerSilo)
	dir = writeFiles(t, map[string]string{"silo.yaml": bad, "data/cardio.csv": cardioCSV})
	_, err = LoadSilo(dir + "/silo.yaml")
	if w := where(err); !slices.Equal(w, []string{"SC1005 15:13", "SC1005 16:20", "SC1005 17:20"}) {
		t.Fatalf("a bad hash, a relative interpreter and no CPU time: %v (%v)", w, err)
	}
}
