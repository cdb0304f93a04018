package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// memberFlags are how a CLI command authenticates to the pool: an identity
// key and the federation file that pins every member's key.
type memberFlags struct {
	identity       string
	passphraseFile string
	federation     string
	pool           string
}

func (f *memberFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.identity, "identity", "", "identity key file (default $SCELLIS_IDENTITY or $SCELLIS_HOME/identity.key)")
	cmd.Flags().StringVar(&f.passphraseFile, "passphrase-file", "", "file holding the identity key's passphrase, if it is encrypted")
	cmd.Flags().StringVar(&f.federation, "federation", "", "federation file (default $SCELLIS_FEDERATION or $SCELLIS_HOME/federation.yaml)")
	cmd.Flags().StringVar(&f.pool, "pool", "", "aggregator address host:port to try first (default: every aggregator in the federation)")
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// loadMember loads the identity and the federation.
func (f *memberFlags) loadMember(stderr io.Writer) (*identity.Identity, *identity.Federation, error) {
	keyPath := firstNonEmpty(f.identity, os.Getenv("SCELLIS_IDENTITY"), filepath.Join(scellisHome(), "identity.key"))
	fedPath := firstNonEmpty(f.federation, os.Getenv("SCELLIS_FEDERATION"), filepath.Join(scellisHome(), "federation.yaml"))
	opts := identity.LoadOptions{}
	if f.passphraseFile != "" {
		p, err := identity.ReadPassphraseFile(f.passphraseFile)
		if err != nil {
			return nil, nil, err
		}
		opts.Passphrase = p
	}
	id, warnings, err := identity.Load(keyPath, opts)
	if err != nil {
		return nil, nil, err
	}
	if len(warnings) > 0 {
		diag.Render(stderr, warnings)
	}
	fed, err := identity.LoadFederation(fedPath)
	if err != nil {
		return nil, nil, err
	}
	return id, fed, nil
}

// client returns an API client for the pool, after following the
// membership changes made since the federation file (membership.go): a
// member added through the log, or an aggregator's rotated key, works
// without a new file.
func (f *memberFlags) client(stderr io.Writer) (*api.Client, *identity.Federation, error) {
	id, fed, err := f.loadMember(stderr)
	if err != nil {
		return nil, nil, err
	}
	if err := followLog(id, fed, "", ""); err != nil {
		return nil, nil, err
	}
	c, err := api.NewClient(id, fed)
	if err != nil {
		return nil, nil, err
	}
	if f.pool != "" {
		eps := []string{"https://" + f.pool}
		for _, e := range c.Endpoints() {
			if e != eps[0] {
				eps = append(eps, e)
			}
		}
		tlsCfg, err := identity.ClientTLSConfig(id, fed, "", identity.Aggregator)
		if err != nil {
			return nil, nil, err
		}
		c = api.NewClientTLS(api.Transport(tlsCfg), eps)
	}
	// A person waits for an answer: when no aggregator answers at all,
	// say so within seconds instead of retrying for the whole budget.
	c.GiveUpAfter = giveUpAfter
	return c, fed, nil
}

// giveUpAfter is how long a CLI command tries to reach an aggregator
// that never answers before it fails with SC7103.
const giveUpAfter = 12 * time.Second

// describeRead says where a status read was answered and how fresh it is.
func describeRead(info api.ReadInfo) string {
	if info.Node == "" {
		return "read from a single node"
	}
	how := fmt.Sprintf("leader contact %dms ago", info.LeaderContactMs)
	if info.Linearizable {
		how = "linearizable: the leader confirmed it leads and applied every committed write"
	}
	return fmt.Sprintf("read from %s at applied index %d (%s)", info.Node, info.AppliedIndex, how)
}

func printJSON(w io.Writer, b []byte) {
	fmt.Fprintln(w, string(b))
}

// idCommand builds a command that takes one job or run ID (named by the
// second word of use: JOB_ID or RUN_ID), authenticates to the pool as a
// member, resolves a short ID prefix to the full ID, and calls fn with a
// context that an interrupt cancels.
func idCommand(use, short string, fn func(ctx context.Context, cmd *cobra.Command, c *api.Client, id content.Ref) error) *cobra.Command {
	return fedIDCommand(use, short, func(ctx context.Context, cmd *cobra.Command, c *api.Client, _ *identity.Federation, id content.Ref) error {
		return fn(ctx, cmd, c, id)
	})
}

// fedIDCommand is idCommand for a command that also checks signatures
// against the federation file (a run's contribution records).
func fedIDCommand(use, short string, fn func(ctx context.Context, cmd *cobra.Command, c *api.Client, fed *identity.Federation, id content.Ref) error) *cobra.Command {
	var f memberFlags
	arg := strings.Fields(use)[1]
	kind := jobID
	if arg == "RUN_ID" {
		kind = runID
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(1, arg),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			c, fed, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			id, err := resolveID(ctx, c, args[0], kind)
			if err != nil {
				return err
			}
			return fn(ctx, cmd, c, fed, id)
		},
	}
	f.register(cmd)
	return cmd
}
