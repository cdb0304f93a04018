package diag

import (
	"fmt"
	"sort"
)

// Code is a stable diagnostic code such as SC1203. Every code is defined
// once, in one of the codes_*.go files, with a one-line title; a test checks
// that docs/diagnostics.md documents each of them.
//
// Ranges: SC1xxx job specs and configs, SC2xxx content and the sandbox,
// SC3xxx data files, SC4xxx trust and admission, SC5xxx privacy, SC6xxx secure
// aggregation, SC7xxx pools and coordination, SC8xxx consensus, SC9xxx
// silos and federated training.
type Code string

var registry = map[Code]string{}

// define registers a code at package initialisation; defining one twice is a
// programming error caught the first time the binary starts.
func define(code, title string) Code {
	c := Code(code)
	if _, dup := registry[c]; dup {
		panic(fmt.Sprintf("diag: code %s defined twice", code))
	}
	registry[c] = title
	return c
}

// Title returns the one-line title of a code, or "" if it is not defined.
func Title(c Code) string { return registry[c] }

// Codes returns every defined code in order.
func Codes() []Code {
	out := make([]Code, 0, len(registry))
	for c := range registry {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
