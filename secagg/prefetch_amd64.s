//go:build amd64 && !purego

#include "textflag.h"

// func prefetch(p *byte, n int)
//
// PREFETCHT0 of every 64-byte line of [p, p+n).
TEXT ·prefetch(SB), NOSPLIT, $0-16
	MOVQ  p+0(FP), SI
	MOVQ  n+8(FP), CX
	TESTQ CX, CX
	JLE   done
loop:
	PREFETCHT0 (SI)
	ADDQ  $64, SI
	SUBQ  $64, CX
	JG    loop
done:
	RET
