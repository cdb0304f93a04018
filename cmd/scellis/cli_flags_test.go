package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// checkedInCommand are the numeric flags without a declared range whose
// command checks the value itself (a diagnostic, exit code 2, tested in
// the script named), or for which every value is valid.
var checkedInCommand = map[string]string{
	"scellis datagen hospitals --rows":    "datagen.txtar: SC1005 outside 1..10000000",
	"scellis datagen hospitals --sites":   "datagen.txtar: SC1005 outside 1..1000",
	"scellis datagen hospitals --seed":    "any seed is valid",
	"scellis datagen synthetic --alpha":   "SC1005 unless finite and ≥ 0 (non-finite: SC1203 for every float flag)",
	"scellis datagen synthetic --beta":    "SC1005 unless finite and ≥ 0",
	"scellis datagen synthetic --devices": "SC1005 outside 1..10000",
	"scellis datagen synthetic --seed":    "any seed is valid",
	"scellis datagen glyphs --seed":       "any seed is valid",
	"scellis topology simulate --members": "SC1005 outside 1..10^6 (a list: flagRange takes one number)",
	"scellis topology simulate --fanout":  "SC1005 below 3 (a list)",
}

// Every numeric flag of every command is range-checked before the command
// runs (flagRange, SC1203), or listed above with where its command checks
// it: a flag added without either fails here.
func TestNumericFlagsRangeChecked(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			ty := f.Value.Type()
			if !strings.HasPrefix(ty, "int") && !strings.HasPrefix(ty, "uint") && !strings.HasPrefix(ty, "float") {
				return
			}
			key := c.CommandPath() + " --" + f.Name
			if len(f.Annotations[flagRangeKey]) != 2 && checkedInCommand[key] == "" {
				t.Errorf("%s (%s) has no range: declare one with flagRange, or check it in the command and list it in checkedInCommand", key, ty)
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRoot())
}
