package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/verify"
)

// Document is result.json: the reduced result and everything needed to
// replay it — the job ID, every content ref and input ref it ran, and each
// shard's result hash. It holds no timestamps or paths, so two runs of the
// same job write byte-identical documents.
type Document struct {
	Format       string        `json:"format"`
	Job          DocJob        `json:"job"`
	Content      []ContentRef  `json:"content"`
	Inputs       []DocInput    `json:"inputs"`
	Verification DocVerify     `json:"verification"`
	Shards       []DocShard    `json:"shards"`
	WorkUnits    int64         `json:"work_units"`
	Result       any           `json:"result"`
	Files        []string      `json:"files,omitempty"`
	Unverified   []int         `json:"unverified,omitempty"`
	Extra        *DocExtension `json:"extra,omitempty"`
}

// DocJob identifies the job.
type DocJob struct {
	ID     content.Ref `json:"id"`
	Name   string      `json:"name"`
	Regime string      `json:"regime"`
}

// DocInput cites an input by hash.
type DocInput struct {
	Name  string      `json:"name"`
	Ref   content.Ref `json:"ref"`
	Class string      `json:"class"`
	Rows  int         `json:"rows"`
}

// DocVerify says how results were checked.
type DocVerify struct {
	Tier string `json:"tier"`
	// Tolerance is the convergent tier's, as "abs=…,rel=…,per=…".
	Tolerance string `json:"tolerance,omitempty"`
	Method    string `json:"method"`
	Verified  int    `json:"verified"`
	// ErrorProbability bounds the chance that a wrong result passed the
	// method's check (Freivalds: 2^-k per shard).
	ErrorProbability float64 `json:"error_probability,omitempty"`
}

// DocCheck says how one shard's result was checked, when that is more
// than the replayable tier's byte-exact match: the tier, the tolerance,
// the method and the verifier peer whose signed verdict accepted it.
type DocCheck struct {
	Tier             string  `json:"tier"`
	Tolerance        string  `json:"tolerance,omitempty"`
	Method           string  `json:"method"`
	Verifier         string  `json:"verifier,omitempty"`
	ErrorProbability float64 `json:"error_probability,omitempty"`
}

// DocShard is one shard's parameters, price and result hash.
type DocShard struct {
	Index  int            `json:"index"`
	ID     content.Ref    `json:"id"`
	Params map[string]any `json:"params"`
	Cost   int64          `json:"cost"`
	Result content.Ref    `json:"result"`
	Check  *DocCheck      `json:"check,omitempty"`
}

// DocExtension carries pool-specific facts (receipts, peers) for distributed
// runs; a solo run leaves it empty.
type DocExtension struct {
	Receipts []content.Ref `json:"receipts,omitempty"`
}

// DocumentFormat versions result.json.
const DocumentFormat = "scellis/result/v1"

// NewDocument assembles result.json for a plan, its shard results (one per
// shard index, verified) and the reduced value.
func NewDocument(p *Plan, results []*Result, reduced any, method string, unverified []int) *Document {
	d := &Document{
		Format:       DocumentFormat,
		Job:          DocJob{p.ID, p.Spec.Name, string(p.Spec.Regime)},
		Content:      p.Content,
		Inputs:       []DocInput{},
		Verification: DocVerify{Tier: string(p.Tier()), Method: method, Verified: countVerified(results, unverified)},
		WorkUnits:    p.TotalCost(),
		Result:       reduced,
		Unverified:   unverified,
	}
	for _, in := range p.Inputs {
		d.Inputs = append(d.Inputs, DocInput{in.Name, in.Ref, string(in.Class), in.Data.Rows()})
	}
	byIndex := make([]*Result, len(p.Shards))
	for _, r := range results {
		byIndex[r.Index] = r
	}
	var check *DocCheck
	if p.Tier() != verify.Replayable || p.FreivaldsRounds() > 0 {
		check = &DocCheck{Tier: string(p.Tier()), Method: method}
		if p.Tier() == verify.Convergent {
			check.Tolerance = p.Tolerance().String()
		}
		if k := p.FreivaldsRounds(); k > 0 {
			check.ErrorProbability = verify.ErrorProbability(k)
		}
		d.Verification.Tolerance, d.Verification.ErrorProbability = check.Tolerance, check.ErrorProbability
	}
	for _, sh := range p.Shards {
		ds := DocShard{Index: sh.Index, ID: sh.ID, Params: sh.Params, Cost: sh.Cost}
		if r := byIndex[sh.Index]; r != nil {
			ds.Result = r.Hash
			if check != nil {
				c := *check
				ds.Check = &c
			}
		}
		d.Shards = append(d.Shards, ds)
	}
	return d
}

// Marshal renders the document as indented JSON with a final newline.
func (d *Document) Marshal() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteFileAtomic writes data to path through a temporary file and a rename,
// so a reader never sees a partial file, and a failed run leaves none.
func WriteFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func countVerified(results []*Result, unverified []int) int {
	flagged := map[int]bool{}
	for _, i := range unverified {
		flagged[i] = true
	}
	n := 0
	for _, r := range results {
		if r != nil && !flagged[r.Index] {
			n++
		}
	}
	return n
}
