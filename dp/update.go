package dp

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
