package silo

import (
	"context"
	"errors"

	"github.com/scellis/scellis/fl"
	"github.com/scellis/scellis/secagg/wire"
)

// keyExchange is a round's part in pairwise-masking secure aggregation,
// started as soon as the silo's policy accepted the round, before its
// update exists (issue 19). The advert and the key shares it sends carry
// nothing of the update — fresh keys, signed, and Shamir shares of them —
// so they need no charge; the key exchange then runs while the silo trains
// and writes its release cache, outbox entry and ledger charge, instead of
// after them. The update itself leaves only through give, which the round
// calls once the charge paying for it is durable (law 6); a round that
// ends otherwise calls drop, and the silo sends nothing more: the host
// sees a site that dropped out after sharing its keys (the aggregator
// also excuses it when its declined or failed record is reported).
type keyExchange struct {
	base   string // the host, once found (read after done)
	input  chan wire.Input
	cancel context.CancelFunc
	done   chan struct{}
	err    error // read after done
}

// errNoInput ends a key exchange whose round sends no update.
var errNoInput = errors.New("the silo sends no update in this round")

// startKeyExchange starts the silo's part in b's secure aggregation, or
// returns nil when the round sums by threshold-he (its protocol takes
// the ciphertext in its first message: it starts at the charge, as
// before).
func (a *Appliance) startKeyExchange(ctx context.Context, b fl.RoundBundle, minSurvivors int) *keyExchange {
	if b.HE != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	k := &keyExchange{input: make(chan wire.Input, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		if k.base, k.err = a.secaggHost(ctx, b); k.err != nil {
			return
		}
		k.err = wire.ParticipateBeforeInput(ctx, a.roundTransport(k.base), b.SecAgg, a.ID.PrivateKey(), minSurvivors,
			func(ctx context.Context) (wire.Input, error) {
				select {
				case in := <-k.input:
					return in, nil
				case <-ctx.Done():
					return wire.Input{}, errNoInput
				}
			})
	}()
	return k
}

// give hands over the round's charged input and waits for the silo's
// part to end: nil once the host accepted its unmasking. The part may
// have failed before (the round failed or was aborted): then the input
// is not sent, and that error is returned.
func (k *keyExchange) give(in wire.Input) (base string, err error) {
	k.input <- in // buffered: never blocks, and is not read after done
	<-k.done
	k.cancel()
	return k.base, k.err
}

// drop ends the silo's part without an input and waits for it to stop;
// nothing more is sent. It may be called after give (then it only
// waits).
func (k *keyExchange) drop() {
	k.cancel()
	<-k.done
}

// over returns why the silo's part already ended, or nil while it runs:
// a round whose secure aggregation failed before the update was charged
// (too few sites advertised, the host aborted it) is neither cached nor
// charged.
func (k *keyExchange) over() error {
	select {
	case <-k.done:
		if k.err == nil {
			return errors.New("the secure aggregation round ended before this silo's update was given") // not reached: the part waits for it
		}
		return k.err
	default:
		return nil
	}
}
