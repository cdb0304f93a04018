package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/identity"
)

// Membership through the log: the federation file is the bootstrap, and
// `scellis federation add|revoke|rotate` change the membership while the
// federation runs (docs/identity.md). Every process that talks to the
// aggregators follows the signed changes (followLog at start, then
// api.FollowMembership for daemons).

// followLog brings fed up to date with the membership changes the
// aggregators hold. A person's key listed in fed needs it only to follow
// rotated aggregator keys, so failing is not fatal and takes at most a
// few seconds (a listed appliance skips it); a key that is not in the file (a member added through the log)
// cannot work without it, and a failure is reported: SC1110 when the
// changes do not list it, SC1119 when the aggregators refuse it. name and
// role say who an unlisted key claims to be ("" for a person's CLI).
func followLog(id *identity.Identity, fed *identity.Federation, name string, role identity.Role) error {
	_, listed := fed.Lookup(id.Public())
	if listed && name != "" {
		// A listed appliance need not wait: an aggregator follows the log
		// in its own replica, a silo or worker from its first
		// FollowMembership poll, at once. Asking here would only slow a
		// federation's start while the aggregators elect a leader.
		return nil
	}
	via := fed
	if !listed {
		if name == "" {
			name, role = "unlisted", identity.Researcher
		}
		// Authenticate with this key while fetching the changes that list
		// it: a private copy of the membership names it.
		via = fed.With(identity.Member{Name: name, Role: role, PublicKey: id.Public()})
	}
	c, err := api.NewClient(id, via)
	if err != nil {
		return err
	}
	budget := 3 * time.Second
	if !listed {
		budget = giveUpAfter
	}
	c.GiveUpAfter = budget
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	_, err = api.SyncMembership(ctx, c, fed)
	if listed {
		return nil // best effort: the command itself reports an unreachable pool
	}
	if err != nil {
		return err
	}
	if _, ok := fed.Lookup(id.Public()); !ok {
		return diag.New(diag.NotAMember, "identity", "this identity (%s) is not a member of federation %s: not in %s, nor added since", id.Public(), fed.Name, fed.File).
			WithHelp("ask an operator to add it (scellis federation add NAME --role ROLE --public-key %s), or use a member's key with --identity", id.Public())
	}
	return nil
}

// membershipPoll is how often silos and workers fetch new membership
// changes (one small GET; a change reaches them within this long).
const membershipPoll = 3 * time.Second

func newFederationChangeCmds() []*cobra.Command {
	var add struct {
		memberFlags
		role, key, address, raftAddress string
	}
	addCmd := &cobra.Command{
		Use:   "add NAME --role ROLE --public-key KEY",
		Short: "Add a member to the running federation (signed by an operator, applied through Raft)",
		Long: `Add a member while the federation runs: the change is signed with your
identity (which must have the operator role), applied through the Raft log,
and every aggregator, silo and worker accepts the new member's key at once,
without a restart. The new member starts with the same federation file as
everyone else; it fetches the changes that list it from the aggregators.
An aggregator added this way then joins the Raft cluster with
'scellis aggregator join NAME'.`,
		Example: `  scellis federation add hospital-e --role silo --public-key "$(cat hospital-e/identity.pub)"
  scellis federation add dr-bob --role researcher --public-key ed25519:…`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if add.role == "" || add.key == "" {
				return usageError{fmt.Errorf("--role and --public-key are required")}
			}
			return changeMembership(cmd, &add.memberFlags, identity.Change{Op: identity.OpAdd, Name: args[0], Role: identity.Role(add.role),
				PublicKey: add.key, Address: add.address, RaftAddress: add.raftAddress})
		},
	}
	add.register(addCmd)
	addCmd.Flags().StringVar(&add.role, "role", "", "aggregator, silo, worker, researcher or operator")
	addCmd.Flags().StringVar(&add.key, "public-key", "", "the member's public key (the line in its identity.pub)")
	addCmd.Flags().StringVar(&add.address, "address", "", "host:port where the member serves (required for an aggregator)")
	addCmd.Flags().StringVar(&add.raftAddress, "raft-address", "", "host:port of an aggregator's Raft transport (required for an aggregator)")

	var rev memberFlags
	revokeCmd := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a member: its leases are revoked, its connections closed, its key refused",
		Long: `Revoke a member while the federation runs. Its open leases are revoked (the
shards go to other peers), the aggregators close its connections, and its key
is refused from then on — also if it is later offered for another member.
The last operator cannot be revoked, nor an aggregator that is still a Raft
voter (run 'scellis aggregator leave NAME' first).`,
		Example: "  scellis federation revoke lab-worker",
		Args:    exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return changeMembership(cmd, &rev, identity.Change{Op: identity.OpRevoke, Name: args[0]})
		},
	}
	rev.register(revokeCmd)

	var rot struct {
		memberFlags
		key string
	}
	rotateCmd := &cobra.Command{
		Use:   "rotate NAME --public-key NEW_KEY",
		Short: "Give a member a new key; the old one is refused from then on",
		Long: `Rotate a member's key while the federation runs. Make the new key first
(scellis keygen --out DIR) and put it where the member's config points
("identity:"), keeping the running process as it is. When the rotation
applies, every node pins the new key and refuses the old one; a rotated
aggregator loads its identity file again and switches to the new key at
once, with no restart (if the file did not hold it yet, put it there and
send the aggregator SIGHUP). Connections already open stay up.`,
		Example: `  scellis keygen --out /etc/scellis/next --name agg-2 --role aggregator
  cp /etc/scellis/next/identity.key /etc/scellis/identity.key
  scellis federation rotate agg-2 --public-key "$(cat /etc/scellis/next/identity.pub)"`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rot.key == "" {
				return usageError{fmt.Errorf("--public-key is required")}
			}
			return changeMembership(cmd, &rot.memberFlags, identity.Change{Op: identity.OpRotate, Name: args[0], PublicKey: rot.key})
		},
	}
	rot.register(rotateCmd)
	rotateCmd.Flags().StringVar(&rot.key, "public-key", "", "the member's new public key (the line in its new identity.pub)")

	var mem memberFlags
	membersCmd := &cobra.Command{
		Use:   "members",
		Short: "List the members as they are now: the federation file plus every change since",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, fed, err := mem.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return printMembers(cmd.OutOrStdout(), fed)
		},
	}
	mem.register(membersCmd)
	return []*cobra.Command{addCmd, revokeCmd, rotateCmd, membersCmd}
}

// changeMembership signs c as the caller (who must be an operator) at the
// membership's current place and submits it.
func changeMembership(cmd *cobra.Command, f *memberFlags, c identity.Change) error {
	if ds := api.CheckChange(c); len(ds) > 0 {
		return ds
	}
	client, fed, err := f.client(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	id, _, err := f.loadMember(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	me, _ := fed.Lookup(id.Public())
	if me.Role != identity.Operator {
		return diag.New(diag.MembershipSignature, "identity", "%s is a %s; membership changes are signed by an operator", me.Name, me.Role).
			WithHelp("use an operator's key with --identity")
	}
	c.Federation, c.Operator, c.Seq = fed.Name, me.Name, fed.Applied()
	sc, err := identity.SignChange(id, c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	defer cancel()
	resp, err := client.ChangeMembership(ctx, sc)
	if err != nil {
		return err
	}
	if jsonOutput {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(resp)
	}
	verb := map[identity.ChangeOp]string{identity.OpAdd: "added", identity.OpRevoke: "revoked", identity.OpRotate: "re-keyed"}[c.Op]
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s (membership change %d, signed by %s)\n", verb, c.Name, resp.Seq, me.Name)
	if len(resp.LeasesRevoked) > 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", plural(len(resp.LeasesRevoked), "open lease"))
	}
	return nil
}

func printMembers(w io.Writer, fed *identity.Federation) error {
	ms := fed.Current()
	if jsonOutput {
		out := struct {
			Federation string             `json:"federation"`
			Changes    int                `json:"changes"`
			Members    []federationMember `json:"members"`
		}{fed.Name, fed.Applied(), []federationMember{}}
		for _, m := range ms {
			out.Members = append(out.Members, federationMember{m.Name, string(m.Role), m.PublicKey.String(), m.Address, m.RaftAddress})
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(w, "federation %s: %s (%s since the file)\n", fed.Name, plural(len(ms), "member"), plural(fed.Applied(), "change"))
	for _, m := range ms {
		fmt.Fprintf(w, "  %-16s %-10s %s %s\n", m.Name, m.Role, m.PublicKey, m.Address)
	}
	return nil
}
