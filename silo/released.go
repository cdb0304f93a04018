package silo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/internal/safefile"
	"github.com/scellis/scellis/secagg/wire"
)

// A silo pays for a round once (law 12). It keeps what it released for a
// round — the packed input it handed to secure aggregation (the noised
// update and metric sums, exactly as released, before masking) and its
// weight — in DATA_DIR/<run>/round-<r>.released (mode 0600), written and
// fsync'd before the ledger is charged. When the round is planned again
// (its secure aggregation was lost with a leader, or failed), the silo sees
// its charge for (run, round) in the ledger and re-sends this same value:
// no new training, no new noise, no new charge. Under DP the release is
// the update's integers on the secure-aggregation grid, noise included
// (wire.Input.Encoded); otherwise the float vector (wire.Input.Values). Re-releasing a value
// already released is post-processing of that release (docs/dp.md).

// releasedFormat names the file's encoding.
const releasedFormat = "scellis/silo-released/v1"

// released is one round's release, bound to the round and to the model
// the update was computed from.
type released struct {
	Format string      `cbor:"format"`
	Run    content.Ref `cbor:"run"`
	Round  int         `cbor:"round"`
	Global content.Ref `cbor:"global"` // the global model the update was trained from
	// Exactly what secure aggregation received: the float input (update
	// and summed metrics) or, under DP, the noised integers on the grid.
	Values  []float64 `cbor:"values,omitempty"`
	Encoded []int64   `cbor:"encoded,omitempty"`
	Weight  float64   `cbor:"weight"`
	State   []byte    `cbor:"state"` // the client state after the step (fl.EncodeState)
}

// releasedPath is where round r of run is cached (next to the run's
// client state; statePath checks the run ID).
func (a *Appliance) releasedPath(run content.Ref, round int) (string, error) {
	state, err := a.statePath(run)
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(state), fmt.Sprintf("round-%d.released", round)), nil
}

// saveReleased writes rel durably (temporary file, fsync, rename, folder
// fsync), readable by the silo's user only.
func (a *Appliance) saveReleased(rel released) error {
	b, err := content.Encode(&rel)
	if err != nil {
		return err
	}
	path, err := a.releasedPath(rel.Run, rel.Round)
	if err != nil {
		return err
	}
	return writeDurable(path, b, 0o600)
}

// loadReleased reads the release cached for (run, round); os.ErrNotExist
// if there is none.
func (a *Appliance) loadReleased(run content.Ref, round int) (released, error) {
	var rel released
	path, err := a.releasedPath(run, round)
	if err != nil {
		return rel, err
	}
	b, err := safefile.ReadFile(path, safefile.MaxLedger)
	if err != nil {
		return rel, err
	}
	if err := content.Decode(b, &rel); err != nil {
		return rel, fmt.Errorf("the cached release is damaged: %w", err)
	}
	if rel.Format != releasedFormat || rel.Run != run || rel.Round != round {
		return rel, errors.New("the cached release belongs to another round")
	}
	return rel, nil
}

// writeDurable replaces path with b atomically and durably: a temporary
// file in the same folder, fsync'd, renamed over path, the folder fsync'd.
func writeDurable(path string, b []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

// releaseDigest names a release in the silo's own log: the hash of exactly
// what secure aggregation receives (input and weight). The log line of the
// first release and that of a re-send must name the same digest (law 12);
// a hash of a noised release says nothing the release does not, and the
// log stays on the site.
func releaseDigest(in wire.Input) content.Ref {
	b, err := content.Encode(struct {
		Values  []float64 `cbor:"values,omitempty"`
		Encoded []int64   `cbor:"encoded,omitempty"`
		Weight  float64   `cbor:"weight"`
	}{in.Values, in.Encoded, in.Weight})
	if err != nil {
		return ""
	}
	return content.Hash(b)
}
