// Package fl is the federated-learning core that does not depend on the
// network: aggregation strategies loaded from the catalog as content, and a
// pure, in-process round API — Init, ClientStep (at a silo), ServerStep (at
// the reducer peer) and Evaluate — plus Simulate, the whole round loop in one
// process, used by tests and as the baseline of benchmarks.
//
// A strategy is a catalog entry (kind catalog.Strategy) defining
// client_step(global, data, params, state) and server_step(global, sum,
// total_weight, params), and optionally init(params, dims) and
// evaluate(global, data, params); docs/content.md states the contract and
// docs/fl.md how each built-in follows its paper. The engine never branches
// on a strategy's name.
//
// Invariant: the server step sees only sums. ServerStep takes the
// elementwise sum of the round's updates and the sum of their weights, and
// nothing else derived from any one site, so every strategy composes with
// secure aggregation. Differential privacy is the engine's, not the
// content's: record-level DP-SGD is imposed on every model.train the
// content runs (script.TrainingPolicy), and update-level DP clips and noises
// the update after client_step returns.
package fl
