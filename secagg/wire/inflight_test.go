package wire

import (
	"context"
	"testing"
)

// TestInflightBounds: the host lets in at most MaxInputsInFlight bodies
// and MaxInputBytesInFlight bytes at once, one body however large when it
// is alone, and a waiter in once a body is let go (or out when its request
// ends).
func TestInflightBounds(t *testing.T) {
	f := newInflight(3, 100)
	ctx := context.Background()
	quit := make(chan struct{})
	ended, cancel := context.WithCancel(ctx)
	cancel()
	fits := func(size int64) (func(), bool) { return f.take(ended, quit, size) }

	a, ok := f.take(ctx, quit, 60)
	if !ok {
		t.Fatal("the first body was not let in")
	}
	if _, ok := fits(50); ok {
		t.Fatal("160 bytes in flight, over a budget of 100")
	}
	b, ok := fits(40)
	if !ok {
		t.Fatal("100 bytes in flight refused under a budget of 100")
	}
	a()
	b()
	big, ok := fits(1 << 30)
	if !ok {
		t.Fatal("a body larger than the budget was not let in alone")
	}
	if _, ok := fits(1); ok {
		t.Fatal("a body let in beside one that takes the whole budget")
	}
	got := make(chan bool)
	go func() {
		release, ok := f.take(ctx, quit, 10)
		if ok {
			release()
		}
		got <- ok
	}()
	big()
	if !<-got {
		t.Fatal("a waiting body was not let in once the large one was let go")
	}
	var held []func()
	for range 3 {
		r, ok := fits(1)
		if !ok {
			t.Fatal("small bodies refused under the count bound")
		}
		held = append(held, r)
	}
	if _, ok := fits(1); ok {
		t.Fatal("a fourth body let in with MaxInputsInFlight 3")
	}
	close(quit)
	if _, ok := f.take(ctx, quit, 1); ok {
		t.Fatal("a body let in after the host closed, over the bound")
	}
	for _, r := range held {
		r()
	}
}
