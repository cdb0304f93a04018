package datagen

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// Site is one participant's generated data.
type Site struct {
	// Name names the site and its file (Name + ".csv").
	Name string
	// Data holds the rows; its Label is the label column.
	Data *model.Dataset
	// Truth is the model the labels were drawn from, on raw (unstandardised)
	// features in the canonical parameter layout of package model: a
	// logistic model for hospitals, a softmax model for Synthetic devices.
	Truth *model.Model
}

// WriteSites writes one CSV per site into dir (created if needed) and returns
// the paths in site order. Each file is written under a temporary name and
// renamed when complete, so a failed run leaves no truncated CSV behind.
func WriteSites(dir string, sites []Site) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, diag.New(diag.FileUnreadable, dir, "cannot create the output directory: %v", err).
			WithHelp("choose a directory this user may write to")
	}
	paths := make([]string, 0, len(sites))
	for _, s := range sites {
		p := filepath.Join(dir, s.Name+".csv")
		if err := writeFile(p, s.Data); err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

func writeFile(path string, d *model.Dataset) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return diag.New(diag.FileUnreadable, path, "cannot write the dataset: %v", err).
			WithHelp("choose a directory this user may write to")
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := model.WriteCSV(f, d); err != nil {
		return fmt.Errorf("datagen: writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("datagen: writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("datagen: writing %s: %w", path, err)
	}
	return nil
}

// siteName numbers sites from 1 with enough zero padding to sort by name.
func siteName(prefix string, i, n int) string {
	width := len(fmt.Sprint(n))
	return fmt.Sprintf("%s-%0*d", prefix, width, i+1)
}

// WriteHospitals writes the sites of Hospitals; it is WriteSites.
func WriteHospitals(dir string, sites []Site) ([]string, error) { return WriteSites(dir, sites) }
