package model

import (
	"math"
	"slices"

	"github.com/scellis/scellis/diag"
)

// Split divides d at random into a training and a test set; the test set
// holds round(testFrac·n) rows. Both keep the rows in their original order.
// The split is a pure function of d and seed. Each side must get at least one
// row, else the error is diag.DatasetTooSmall.
func Split(d *Dataset, testFrac float64, seed uint64) (train, test *Dataset, err error) {
	if err := d.check(); err != nil {
		return nil, nil, err
	}
	if !(testFrac > 0 && testFrac < 1) {
		return nil, nil, diag.New(diag.InvalidValue, d.Name, "test fraction %v is outside (0, 1)", testFrac).
			WithHelp("use a fraction such as 0.2 for a 80/20 split")
	}
	n := d.Rows()
	nTest := int(math.Round(testFrac * float64(n)))
	if nTest < 1 || n-nTest < 1 {
		return nil, nil, diag.New(diag.DatasetTooSmall, d.Name, "%d rows cannot be split %g/%g with at least one row on each side", n, 1-testFrac, testFrac).
			WithHelp("use more rows or a test fraction nearer 0.5")
	}
	perm := identity(n)
	shuffle(newRand("split", seed), perm)
	testIdx := slices.Clone(perm[:nTest])
	trainIdx := slices.Clone(perm[nTest:])
	slices.Sort(testIdx)
	slices.Sort(trainIdx)
	return d.Subset(trainIdx), d.Subset(testIdx), nil
}

// KFold returns fold number fold (0-based) of a k-fold partition of d: test
// is that fold and train the other k−1. Every row is in exactly one test fold
// across fold = 0..k−1, and fold sizes differ by at most one. With stratify,
// each class label is dealt evenly across the folds, so every fold keeps the
// class proportions of d (up to rounding). The partition depends only on d, k
// and seed — not on fold — so the k calls of one cross-validation agree.
func KFold(d *Dataset, k, fold int, seed uint64, stratify bool) (train, test *Dataset, err error) {
	if err := d.check(); err != nil {
		return nil, nil, err
	}
	if k < 2 {
		return nil, nil, diag.New(diag.InvalidValue, d.Name, "k-fold needs k ≥ 2, got %d", k).
			WithHelp("use k = 5 or 10 for cross-validation")
	}
	if fold < 0 || fold >= k {
		return nil, nil, diag.New(diag.InvalidValue, d.Name, "fold %d is outside 0..%d", fold, k-1).
			WithHelp("folds are numbered from 0 to k-1")
	}
	n := d.Rows()
	if n < k {
		return nil, nil, diag.New(diag.DatasetTooSmall, d.Name, "%d rows cannot make %d non-empty folds", n, k).
			WithHelp("use at most %d folds, or more rows", max(n, 1))
	}
	foldOf := assignFolds(d, k, seed, stratify)
	var trainIdx, testIdx []int
	for i, f := range foldOf {
		if f == fold {
			testIdx = append(testIdx, i)
		} else {
			trainIdx = append(trainIdx, i)
		}
	}
	return d.Subset(trainIdx), d.Subset(testIdx), nil
}

// assignFolds deals rows to folds round-robin after a seeded shuffle. With
// stratify the rows are grouped by label (labels in increasing order) and the
// groups are dealt one after another, continuing the round-robin, which keeps
// each class balanced across folds and the fold sizes within one of each other.
func assignFolds(d *Dataset, k int, seed uint64, stratify bool) []int {
	n := d.Rows()
	r := newRand("kfold", seed)
	var order []int
	if stratify {
		groups := map[float64][]int{}
		for i, y := range d.Y {
			groups[y] = append(groups[y], i)
		}
		for _, c := range d.Classes() {
			g := groups[c]
			shuffle(r, g)
			order = append(order, g...)
		}
	} else {
		order = identity(n)
		shuffle(r, order)
	}
	foldOf := make([]int, n)
	for pos, i := range order {
		foldOf[i] = pos % k
	}
	return foldOf
}

func identity(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	return p
}
