package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/dataplane"
	"github.com/scellis/scellis/diag"
)

func init() { commands = append(commands, newP2PCmd) }

func newP2PCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "p2p",
		Short: "The peer-to-peer data plane: probe the path to another member",
	}
	cmd.AddCommand(newP2PProbeCmd())
	return cmd
}

func newP2PProbeCmd() *cobra.Command {
	var (
		f        memberFlags
		size     int
		policy   string
		stun     []string
		loopback bool
	)
	cmd := &cobra.Command{
		Use:   "probe MEMBER",
		Short: "Open a data channel to a member and send it random bytes: which path (direct or relayed), how fast",
		Long: `Connect to MEMBER over the data plane, as a worker or silo moving blobs
would: signalling through the first aggregator's mailbox with signed DTLS
fingerprints, ICE with the aggregator's STUN/TURN server. MEMBER must be
running (an aggregator, or a worker with ice_policy all or relay). The
bytes are hashed by MEMBER and stored nowhere. Exit code 1 when no data
channel can be set up: blobs with MEMBER would then go over HTTPS.

ICE candidates follow the federation file: when every aggregator's address
is loopback (federation init --hosts 127.0.0.1) only loopback addresses are
used; otherwise never loopback, and, for addresses given as IPs, only the
interfaces that route to them.`,
		Example: `  scellis p2p probe agg-1
  scellis p2p probe worker-2 --policy relay --bytes 8388608`,
		Args: exactArgs(1, "MEMBER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, fed, err := f.loadMember(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			self, _ := fed.Lookup(id.Public())
			if _, ok := fed.Member(args[0]); !ok {
				return diag.New(diag.P2PConfig, args[0], "%q is not a member of the federation", args[0])
			}
			peer, _, err := dataplane.NewMember(dataplane.MemberConfig{Identity: id, Fed: fed, Name: self.Name, Policy: policy, STUN: stun, Loopback: loopback})
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 60*time.Second)
			defer cancel()
			go peer.Run(ctx)
			defer peer.Close()
			res, err := peer.Probe(ctx, args[0], size)
			if err != nil {
				return &exitError{code: 1, msg: fmt.Sprintf("no data channel to %s: %v (blobs with %s go over the https fallback)", args[0], err, args[0])}
			}
			if jsonOutput {
				b, _ := json.MarshalIndent(res, "", "  ")
				printJSON(cmd.OutOrStdout(), b)
				return nil
			}
			rate := float64(res.Bytes) / res.Elapsed.Seconds() / 1e6
			fmt.Fprintf(cmd.OutOrStdout(), "%s → %s: path %s (%s), connected in %v, %d bytes in %v (%.1f MB/s)\n",
				self.Name, args[0], res.Path, res.Pair, res.Connect.Round(time.Millisecond), res.Bytes, res.Elapsed.Round(time.Millisecond), rate)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&size, "bytes", 1<<20, "bytes to send")
	flagRange(cmd, "bytes", "1", "1073741824")
	cmd.Flags().StringVar(&policy, "policy", dataplane.PolicyAll, "ICE policy: all (direct first) or relay (TURN only)")
	cmd.Flags().StringSliceVar(&stun, "stun", nil, "extra STUN/TURN server URLs")
	// Implied by a federation whose addresses are all loopback (dataplane
	// scope.go); kept so that scripts written for it still run.
	cmd.Flags().BoolVar(&loopback, "loopback", false, "use loopback addresses only (deprecated: implied when every aggregator's address is loopback)")
	return cmd
}
