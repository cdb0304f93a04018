package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/identity"
)

// modelVerification is what `model verify` reports.
type modelVerification struct {
	File       string `json:"file"`
	Signer     string `json:"signer"`
	Key        string `json:"key"`
	Federation string `json:"federation,omitempty"` // empty: the signer's membership was not checked
	Run        string `json:"run"`
	RunName    string `json:"run_name"`
	Steps      int    `json:"steps"`
	Silos      int    `json:"silos"`
	Receipts   int    `json:"receipts"`
}

func newModelVerifyCmd() *cobra.Command {
	var federation string
	cmd := &cobra.Command{
		Use:   "verify MODEL [--federation federation.yaml]",
		Short: "Check a model file's signature: which aggregator exported it, and that nothing in it changed since",
		Long: `An aggregator node assembles a model file (scellis fl model) from its
replica of the run and signs everything in it — model, standardiser, run
spec, every step's summary, each silo's charges, the refs — with its
identity key. verify checks the signature over the file's content, and with
--federation that the signer is an aggregator of that federation. It proves
which cluster node exported the file from replicated state; it does not
prove the training was honest beyond what the receipts show (SECURITY.md).
A file no node signed (fl simulate's) is refused as unsigned (SC9407).`,
		Example: `  scellis model verify model.json --federation federation.yaml`,
		Args:    exactArgs(1, "MODEL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := fl.ReadModelFile(args[0])
			if err != nil {
				return err
			}
			if f.Attestation == nil {
				return diag.New(diag.ModelUnsigned, args[0], "%s is unsigned: no aggregator node vouches for its content (fl simulate and hand-made files are unsigned)", args[0]).
					WithHelp("export the model from the cluster with scellis fl model RUN_ID --out FILE to get a signed file")
			}
			res := modelVerification{File: args[0], Signer: f.Attestation.Member, Key: f.Attestation.Key.String(), Run: string(f.Run.ID), RunName: f.Run.Name,
				Steps: len(f.Rounds), Silos: len(f.Privacy), Receipts: len(f.Refs.Receipts)}
			if federation != "" {
				fed, err := identity.LoadFederation(federation)
				if err != nil {
					return err
				}
				if err := checkModelSigner(f, fed, args[0]); err != nil {
					return err
				}
				res.Federation = federation
			}
			out := cmd.OutOrStdout()
			if jsonOutput {
				b, _ := json.MarshalIndent(res, "", "  ")
				fmt.Fprintln(out, string(b))
				return nil
			}
			fmt.Fprintf(out, "%s: signature valid: aggregator node %s (key %s) exported it from its replica of run %s (%s)\n", res.File, res.Signer, res.Key, res.RunName, res.Run)
			fmt.Fprintf(out, "covered: the model (%s, %d inputs, %d parameters), its standardiser, the run spec, %d steps' summaries, %d silos' charges, %d receipt refs\n",
				f.Kind, f.Inputs, len(f.Params), res.Steps, res.Silos, res.Receipts)
			if res.Federation != "" {
				fmt.Fprintf(out, "signer: an aggregator of %s\n", res.Federation)
			} else {
				fmt.Fprintln(out, "signer: not checked against a federation (give --federation FILE: anyone can sign a file with a key of their own)")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&federation, "federation", "", "federation file: the signer must be one of its aggregators")
	return cmd
}

// checkModelSigner refuses a model file not signed by an aggregator of fed
// under the key fed lists for it (SC9407 unsigned, SC9408 another signer).
// The signature itself was checked when the file was parsed.
func checkModelSigner(f *fl.ModelFile, fed *identity.Federation, file string) error {
	a := f.Attestation
	if a == nil {
		return diag.New(diag.ModelUnsigned, file, "%s is unsigned: no aggregator node vouches for its content", file).
			WithHelp("export the model from the cluster with scellis fl model RUN_ID --out FILE")
	}
	m, ok := fed.Member(a.Member)
	switch {
	case !ok:
		return diag.New(diag.ModelSignerUnknown, file, "%s is signed by %s, who is not a member of the federation", file, a.Member).
			WithHelp("check it against the federation of the cluster that exported it (--federation FILE)")
	case m.Role != identity.Aggregator:
		return diag.New(diag.ModelSignerUnknown, file, "%s is signed by %s, a %s: only an aggregator node exports model files", file, a.Member, m.Role).
			WithHelp("a model file is exported by the cluster (scellis fl model); this one was signed elsewhere")
	case !m.PublicKey.Equal(a.Key):
		return diag.New(diag.ModelSignerUnknown, file, "%s is signed by key %s in %s's name; the federation lists %s for it", file, a.Key, a.Member, m.PublicKey).
			WithHelp("the key was rotated since the export, or the file was signed by someone else: check it against the federation file of the export's time")
	}
	return nil
}
