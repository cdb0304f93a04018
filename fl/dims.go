package fl

import (
	"context"

	"github.com/scellis/scellis/script"
)

// UpdateDims returns the length of the update vector a site sums in a
// round from global: the strategy's update_dims(global, params) when it
// defines one (SCAFFOLD sends Δy and Δc concatenated, 2·len(w)), else
// len(global["w"]). The aggregator sizes the round's secure sum with it
// before any silo is asked, so it must not depend on any site's data.
func UpdateDims(ctx context.Context, env script.Env, s *Strategy, global Global) (int, error) {
	env.Training = nil
	if !s.Entry.HasFunc("update_dims") {
		w, ok := global.Vector("w")
		if !ok || len(w) == 0 {
			return 0, contract(s, "client_step", "has no update_dims, and the global state has no vector \"w\" to size the update by")
		}
		return len(w), nil
	}
	res, err := script.Call(ctx, env, s.Entry, "update_dims", map[string]any(global), s.params())
	if err != nil {
		return 0, err
	}
	n, ok := res.(int64)
	if !ok || n < 1 || n > 1<<27 {
		return 0, contract(s, "update_dims", "returned %s; it must return the update's length, an int from 1 to %d", describe(res), 1<<27)
	}
	return int(n), nil
}
