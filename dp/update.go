package dp

// PrivatizeUpdate applies update-level DP to a whole model update, the silo
// being the unit of privacy: it clips update to L2 norm clip and adds
// N(0, (multiplier·clip)²) noise to each coordinate, in place, returning the
// norm before clipping. One call is one step of the Gaussian mechanism with
// sensitivity clip; charge the ledger for it (q = 1 when every round includes
// the silo, or the round's client-sampling rate) before releasing update.
func (n *Noise) PrivatizeUpdate(update []float64, clip, multiplier float64) (norm float64) {
	norm = ClipL2(update, clip)
	n.AddGaussian(update, multiplier*clip)
	return norm
}

// NoisyClippedSum is the DP-SGD aggregation step, the record being the unit
// of privacy: it clips each per-example gradient in grads to L2 norm clip (in
// place), sums them into out (which must have the gradients' length and is
// overwritten), and adds N(0, (multiplier·clip)²) noise to each coordinate of
// the sum. It returns how many gradients were clipped. The batch must come
// from Poisson sampling (PoissonSample) for the accountant's bound to hold;
// divide by the expected batch size q·n, not by len(grads), to keep the
// sensitivity argument intact.
func (n *Noise) NoisyClippedSum(out []float64, grads [][]float64, clip, multiplier float64) (clipped int) {
	clear(out)
	for _, g := range grads {
		if len(g) != len(out) {
			panic("dp: gradient length differs from the output length")
		}
		if norm := ClipL2(g, clip); !(norm <= clip) {
			clipped++
		}
		for i, v := range g {
			out[i] += v
		}
	}
	n.AddGaussian(out, multiplier*clip)
	return clipped
}
