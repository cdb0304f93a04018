package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/datagen"
	"github.com/scellis/scellis/diag"
)

func init() { commands = append(commands, newDatagenCmd) }

func newDatagenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "datagen",
		Short: "Generate federated datasets with a known ground truth",
		Long: `Generate one CSV per site of a federated dataset whose labels come from a
known model, for demos, tests and benchmarks:

  hospitals  non-IID patient records for N hospitals (binary outcome)
  synthetic  FedProx's Synthetic(alpha, beta): 60 features, 10 classes
  glyphs     16×16 grayscale digit images, 10 classes, non-IID by label

The same flags and seed always give byte-identical files.`,
	}
	cmd.AddCommand(newDatagenHospitalsCmd(), newDatagenSyntheticCmd(), newDatagenGlyphsCmd())
	return cmd
}

// noArgs refuses positional arguments with a usage error (exit code 2).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))}
	}
	return nil
}

// datagenFile is one written file, as printed and as JSON.
type datagenFile struct {
	Path    string  `json:"path"`
	Site    string  `json:"site"`
	Rows    int     `json:"rows"`
	Columns int     `json:"columns"`
	Outcome float64 `json:"outcome_rate,omitempty"` // hospitals
	MeanAge float64 `json:"mean_age,omitempty"`     // hospitals
	Classes int     `json:"classes,omitempty"`      // synthetic: distinct labels present
}

type datagenReport struct {
	Kind  string        `json:"kind"`
	Dir   string        `json:"dir"`
	Seed  uint64        `json:"seed"`
	Label string        `json:"label"`
	Alpha *float64      `json:"alpha,omitempty"`
	Beta  *float64      `json:"beta,omitempty"`
	Skew  *float64      `json:"skew,omitempty"`
	Files []datagenFile `json:"files"`
	Rows  int           `json:"rows"`
}

func newDatagenHospitalsCmd() *cobra.Command {
	var (
		sites, rows int
		seed        uint64
		out         string
	)
	cmd := &cobra.Command{
		Use:   "hospitals --out DIR",
		Short: "Patient records for N hospitals, non-IID, with a binary outcome",
		Long: `Write DIR/hospital-1.csv … one file per site of plausible patient records:
age, sex, bmi, systolic_bp, glucose, cholesterol, smoker, exercise_hours,
prior_admissions, and a binary 'outcome' drawn from a known logistic model
(coefficients documented in package datagen). Sites differ in age mix, sex
mix, smoking, risk-factor levels and baseline risk, so outcome prevalence
differs between them (non-IID).`,
		Example: "  scellis datagen hospitals --sites 4 --rows 1500 --seed 7 --out data",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireOut(out); err != nil {
				return err
			}
			gen, err := datagen.Hospitals(sites, rows, seed)
			if err != nil {
				return err
			}
			paths, err := datagen.WriteSites(out, gen)
			if err != nil {
				return err
			}
			rep := datagenReport{Kind: "hospitals", Dir: out, Seed: seed, Label: datagen.HospitalLabel}
			for i, s := range gen {
				f := datagenFile{Path: paths[i], Site: s.Name, Rows: s.Data.Rows(), Columns: s.Data.Dims() + 1}
				for r := range s.Data.Rows() {
					f.Outcome += s.Data.Y[r]
					f.MeanAge += s.Data.Row(r)[0]
				}
				f.Outcome /= float64(f.Rows)
				f.MeanAge = math.Round(10*f.MeanAge/float64(f.Rows)) / 10
				rep.Files = append(rep.Files, f)
				rep.Rows += f.Rows
			}
			return printDatagen(cmd.OutOrStdout(), rep)
		},
	}
	cmd.Flags().IntVar(&sites, "sites", 4, "number of hospitals (one CSV each)")
	cmd.Flags().IntVar(&rows, "rows", 1000, "patient records per hospital")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed; the same seed gives the same files")
	cmd.Flags().StringVar(&out, "out", "", "directory to write the CSV files to (created if missing; required)")
	return cmd
}

func newDatagenSyntheticCmd() *cobra.Command {
	var (
		alpha, beta float64
		devices     int
		seed        uint64
		out         string
	)
	cmd := &cobra.Command{
		Use:   "synthetic --out DIR",
		Short: "FedProx's Synthetic(alpha, beta): 60 features, 10 classes, one CSV per device",
		Long: `Write DIR/device-01.csv … one file per device of the Synthetic(alpha, beta)
dataset of Li et al. 2020 (FedProx): lognormal sample counts plus 50,
device-specific models W_k, b_k ~ N(u_k, 1) with u_k ~ N(0, alpha^2), feature
means v_k ~ N(B_k, 1) with B_k ~ N(0, beta^2), covariance diag(j^-1.2), and
label y = argmax softmax(W_k x + b_k). alpha makes the devices' models differ,
beta their data. Columns x1 … x60 and the label 'y'.`,
		Example: "  scellis datagen synthetic --alpha 1 --beta 1 --devices 30 --seed 1 --out synthetic",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireOut(out); err != nil {
				return err
			}
			gen, err := datagen.Synthetic(alpha, beta, devices, seed)
			if err != nil {
				return err
			}
			return writeClassSites(cmd.OutOrStdout(), gen, datagenReport{Kind: "synthetic", Dir: out, Seed: seed, Label: datagen.SyntheticLabel, Alpha: &alpha, Beta: &beta})
		},
	}
	cmd.Flags().Float64Var(&alpha, "alpha", 1, "heterogeneity of the devices' models (standard deviation of u_k)")
	cmd.Flags().Float64Var(&beta, "beta", 1, "heterogeneity of the devices' data (standard deviation of B_k)")
	cmd.Flags().IntVar(&devices, "devices", 30, "number of devices (one CSV each); the paper uses 30")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed; the same seed gives the same files")
	cmd.Flags().StringVar(&out, "out", "", "directory to write the CSV files to (created if missing; required)")
	return cmd
}

func requireOut(out string) error {
	if out == "" {
		return diag.New(diag.MissingField, "datagen", "no output directory").
			WithHelp("pass --out DIR, for example --out data")
	}
	return nil
}

// writeClassSites writes classification sites to rep.Dir and prints
// rep with each file's rows, columns and classes.
func writeClassSites(w io.Writer, gen []datagen.Site, rep datagenReport) error {
	paths, err := datagen.WriteSites(rep.Dir, gen)
	if err != nil {
		return err
	}
	for i, s := range gen {
		f := datagenFile{Path: paths[i], Site: s.Name, Rows: s.Data.Rows(), Columns: s.Data.Dims() + 1, Classes: len(s.Data.Classes())}
		rep.Files = append(rep.Files, f)
		rep.Rows += f.Rows
	}
	return printDatagen(w, rep)
}

// printDatagen prints what datagen wrote: a line a file, or the report as
// JSON under --json.
func printDatagen(w io.Writer, rep datagenReport) error {
	if jsonOutput {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	switch rep.Kind {
	case "hospitals":
		fmt.Fprintf(w, "wrote %d hospital files to %s (seed %d, label %q)\n", len(rep.Files), rep.Dir, rep.Seed, rep.Label)
		for _, f := range rep.Files {
			fmt.Fprintf(w, "  %-28s %7d rows  outcome %5.1f%%  mean age %.1f\n", f.Path, f.Rows, 100*f.Outcome, f.MeanAge)
		}
	case "synthetic":
		fmt.Fprintf(w, "wrote %d device files of Synthetic(%g,%g) to %s (seed %d, %d features, %d classes, label %q)\n",
			len(rep.Files), *rep.Alpha, *rep.Beta, rep.Dir, rep.Seed, datagen.SyntheticFeatures, datagen.SyntheticClasses, rep.Label)
		for _, f := range rep.Files {
			fmt.Fprintf(w, "  %-28s %7d rows  labels from %d of %d classes\n", f.Path, f.Rows, f.Classes, datagen.SyntheticClasses)
		}
	case "glyphs":
		sites, held := len(rep.Files), ""
		if sites > 0 && rep.Files[sites-1].Site == "test" {
			sites, held = sites-1, " and held-out test.csv"
		}
		fmt.Fprintf(w, "wrote %d site files%s of %d×%d glyphs to %s (seed %d, skew %g, %d classes, label %q)\n",
			sites, held, datagen.GlyphSide, datagen.GlyphSide, rep.Dir, rep.Seed, *rep.Skew, datagen.GlyphClasses, rep.Label)
		for _, f := range rep.Files {
			fmt.Fprintf(w, "  %-28s %7d rows  labels from %d of %d classes\n", f.Path, f.Rows, f.Classes, datagen.GlyphClasses)
		}
	}
	fmt.Fprintf(w, "total %d rows\n", rep.Rows)
	return nil
}

func newDatagenGlyphsCmd() *cobra.Command {
	var (
		sites, rows, test int
		skew              float64
		seed              uint64
		out               string
	)
	cmd := &cobra.Command{
		Use:   "glyphs --out DIR",
		Short: "16×16 grayscale digit images, 10 classes, one CSV per site, non-IID by label",
		Long: `Write DIR/site-1.csv … one file per site of noisy seven-segment digits
(16×16 grayscale, pixels p0 … p255 in [0, 1], label 'label' 0–9), and
DIR/test.csv, held-out rows drawn uniformly over the classes. Each site
draws a fraction --skew of its rows from its own three classes (non-IID by
label), the rest from all ten. A small image task for trainers (a PyTorch
CNN, docs/trainers.md).`,
		Example: "  scellis datagen glyphs --sites 4 --rows 300 --test 500 --out glyphs",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireOut(out); err != nil {
				return err
			}
			gen, held, err := datagen.Glyphs(sites, rows, test, skew, seed)
			if err != nil {
				return err
			}
			if held != nil {
				gen = append(gen, *held)
			}
			return writeClassSites(cmd.OutOrStdout(), gen, datagenReport{Kind: "glyphs", Dir: out, Seed: seed, Label: datagen.GlyphLabel, Skew: &skew})
		},
	}
	cmd.Flags().IntVar(&sites, "sites", 4, "number of sites (one CSV each)")
	cmd.Flags().IntVar(&rows, "rows", 300, "images per site")
	cmd.Flags().IntVar(&test, "test", 500, "held-out images (test.csv; 0 for none)")
	cmd.Flags().Float64Var(&skew, "skew", 0.5, "fraction of a site's images from its own three classes (0: IID)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "random seed; the same seed gives the same files")
	cmd.Flags().StringVar(&out, "out", "", "directory to write the CSV files to (created if missing; required)")
	flagRange(cmd, "sites", "1", "1000")
	flagRange(cmd, "rows", "1", "1048576")
	flagRange(cmd, "test", "0", "1048576")
	flagRange(cmd, "skew", "0", "1")
	return cmd
}
