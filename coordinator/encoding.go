package coordinator

import (
	"bytes"
	"fmt"
	"reflect"

	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/diag"
)

// envelope is the wire form of a command: a CBOR map with exactly one key
// naming the command ("submit", "lease", …) and the command as its value.
type envelope struct {
	Submit  *SubmitJob        `cbor:"submit,omitempty"`
	Lease   *Lease            `cbor:"lease,omitempty"`
	Renew   *RenewLease       `cbor:"renew,omitempty"`
	Release *ReleaseLeases    `cbor:"release,omitempty"`
	Tick    *Tick             `cbor:"tick,omitempty"`
	Report  *ReportResult     `cbor:"report,omitempty"`
	Commit  *CommitResult     `cbor:"commit,omitempty"`
	Reduced *ReportReduced    `cbor:"reduced,omitempty"`
	Verdict *ReportVerdict    `cbor:"verdict,omitempty"`
	Cancel  *CancelJob        `cbor:"cancel,omitempty"`
	Start   *StartRun         `cbor:"start_run,omitempty"`
	Stop    *StopRun          `cbor:"stop_run,omitempty"`
	Flag    *FlagDropped      `cbor:"flag_dropped,omitempty"`
	Retry   *RetryRound       `cbor:"retry_round,omitempty"`
	Resume  *ResumeRun        `cbor:"resume_run,omitempty"`
	Members *ChangeMembership `cbor:"membership,omitempty"`
	Draw    *DrawAudit        `cbor:"draw_audit,omitempty"`
	Readmit *Readmit          `cbor:"readmit,omitempty"`
	Batch   *Batch            `cbor:"batch,omitempty"`
}

// EncodeCommand returns the canonical bytes of c (deterministic CBOR): the
// payload of one Raft log entry.
func EncodeCommand(c Command) ([]byte, error) {
	e, err := wrap(c, true)
	if err != nil {
		return nil, err
	}
	return content.Encode(e)
}

// DecodeCommand parses bytes made by EncodeCommand. It accepts only the
// canonical encoding of exactly one command, so EncodeCommand of the result
// returns b exactly. The command it returns is a value (Lease, not *Lease).
// Reports, alone or in a batch, take a direct decoder (decode_fast.go).
func DecodeCommand(b []byte) (Command, error) {
	if content.CheckCanonical(b) == nil {
		if c, ok := decodeFast(b); ok {
			return c, nil
		}
	}
	return decodeGeneral(b)
}

// decodeGeneral is DecodeCommand through the reflective decoder, for every
// command.
func decodeGeneral(b []byte) (Command, error) {
	var e envelope
	if err := content.Decode(b, &e); err != nil {
		return nil, badCommand("cannot decode command: %v", err)
	}
	c, err := e.unwrap(true)
	if err != nil {
		return nil, err
	}
	again, err := EncodeCommand(c)
	if err != nil || !bytes.Equal(again, b) {
		return nil, badCommand("command is not in canonical encoding (unknown fields, or non-canonical CBOR)")
	}
	return c, nil
}

// MarshalCBOR encodes a batch as a list of command envelopes.
func (b Batch) MarshalCBOR() ([]byte, error) {
	es := make([]envelope, len(b.Commands))
	for i, c := range b.Commands {
		e, err := wrap(c, false)
		if err != nil {
			return nil, err
		}
		es[i] = e
	}
	return content.Encode(es)
}

// UnmarshalCBOR decodes a list of command envelopes; nested batches are
// refused.
func (b *Batch) UnmarshalCBOR(data []byte) error {
	var es []envelope
	if err := content.Decode(data, &es); err != nil {
		return err
	}
	b.Commands = make([]Command, len(es))
	for i := range es {
		c, err := es[i].unwrap(false)
		if err != nil {
			return err
		}
		b.Commands[i] = c
	}
	return nil
}

// deref turns a pointer to a command into the command value; nil for a
// nil pointer or a type that is not a command.
func deref(c Command) Command {
	if c == nil {
		return nil
	}
	v := reflect.ValueOf(c)
	if v.Kind() != reflect.Pointer {
		return c
	}
	if v.IsNil() {
		return nil
	}
	out, _ := v.Elem().Interface().(Command)
	return out
}

func wrap(c Command, batchOK bool) (envelope, error) {
	var e envelope
	switch c := deref(c).(type) {
	case SubmitJob:
		e.Submit = &c
	case Lease:
		e.Lease = &c
	case RenewLease:
		e.Renew = &c
	case ReleaseLeases:
		e.Release = &c
	case Tick:
		e.Tick = &c
	case ReportResult:
		e.Report = &c
	case CommitResult:
		e.Commit = &c
	case ReportReduced:
		e.Reduced = &c
	case ReportVerdict:
		e.Verdict = &c
	case CancelJob:
		e.Cancel = &c
	case StartRun:
		e.Start = &c
	case StopRun:
		e.Stop = &c
	case FlagDropped:
		e.Flag = &c
	case RetryRound:
		e.Retry = &c
	case ResumeRun:
		e.Resume = &c
	case ChangeMembership:
		e.Members = &c
	case DrawAudit:
		e.Draw = &c
	case Readmit:
		e.Readmit = &c
	case Batch:
		if !batchOK {
			return e, badCommand("batches do not nest")
		}
		e.Batch = &c
	default:
		return e, badCommand("not a coordinator command: %T", c)
	}
	return e, nil
}

func (e *envelope) unwrap(batchOK bool) (Command, error) {
	var out []Command
	if e.Submit != nil {
		out = append(out, *e.Submit)
	}
	if e.Lease != nil {
		out = append(out, *e.Lease)
	}
	if e.Renew != nil {
		out = append(out, *e.Renew)
	}
	if e.Release != nil {
		out = append(out, *e.Release)
	}
	if e.Tick != nil {
		out = append(out, *e.Tick)
	}
	if e.Report != nil {
		out = append(out, *e.Report)
	}
	if e.Commit != nil {
		out = append(out, *e.Commit)
	}
	if e.Reduced != nil {
		out = append(out, *e.Reduced)
	}
	if e.Verdict != nil {
		out = append(out, *e.Verdict)
	}
	if e.Cancel != nil {
		out = append(out, *e.Cancel)
	}
	if e.Start != nil {
		out = append(out, *e.Start)
	}
	if e.Stop != nil {
		out = append(out, *e.Stop)
	}
	if e.Flag != nil {
		out = append(out, *e.Flag)
	}
	if e.Retry != nil {
		out = append(out, *e.Retry)
	}
	if e.Resume != nil {
		out = append(out, *e.Resume)
	}
	if e.Members != nil {
		out = append(out, *e.Members)
	}
	if e.Draw != nil {
		out = append(out, *e.Draw)
	}
	if e.Readmit != nil {
		out = append(out, *e.Readmit)
	}
	if e.Batch != nil {
		if !batchOK {
			return nil, badCommand("batches do not nest")
		}
		out = append(out, *e.Batch)
	}
	if len(out) != 1 {
		return nil, badCommand("a command envelope holds %d commands, want exactly 1", len(out))
	}
	return out[0], nil
}

func badCommand(format string, args ...any) *diag.Diagnostic {
	return diag.New(diag.PoolBadCommand, "command", "%s", fmt.Sprintf(format, args...))
}
