//go:build amd64 && !purego

#include "textflag.h"

// func encodeAVX2(dst *byte, x *float64, draws *byte, n int, scale float64, width int) (ties int)
//
// encodeTile's arithmetic four values at a time (n a multiple of 4), bit
// for bit: v = x·scale, fl = ⌊v⌋, t = (v − fl)·2^16, h = int64(t); the
// value is int64(fl) + 1 if d < h, else int64(fl), d the value's 16-bit
// draw; ties is 1 if some d = h. Every floating-point step is the IEEE
// operation the Go loop does (VMULPD, VROUNDPD toward −∞, VSUBPD), h is
// truncated by VCVTTPD2DQ (t is in [0, 2^16]), and int64(fl) — an
// integer below 2^63 in magnitude, which AVX2 cannot convert — is
// rebuilt from its bits: the mantissa with its implicit bit, shifted by
// the exponent (VPSLLVQ/VPSRLVQ give 0 for counts of 64 or more, so ±0
// comes out 0), negated when the sign bit is set.

// ROUND4 encodes the four values at x+8·BX with their draws at
// draws+2·BX into the four int64 lanes of Y6 (ties noted in Y9). It
// prefetches the input 4 KiB ahead, the next tile's (of Z_2^64), which
// the kernel reads after this tile's masks: the input comes from memory
// once, and waiting for it was most of the encoding's time in the kernel.
#define ROUND4 \
	PREFETCHT0  4096(SI)(BX*8); \
	VMOVUPD     (SI)(BX*8), Y0; \
	VMULPD      Y15, Y0, Y0; \
	VROUNDPD    $1, Y0, Y1; \
	VSUBPD      Y1, Y0, Y0; \
	VMULPD      Y14, Y0, Y0; \
	VCVTTPD2DQY Y0, X2; \
	VPMOVSXDQ   X2, Y2; \
	VPMOVZXWQ   (DX)(BX*2), Y3; \
	VPCMPEQQ    Y2, Y3, Y4; \
	VPOR        Y4, Y9, Y9; \
	VPSUBQ      Y2, Y3, Y3; \
	VPSRLQ      $63, Y3, Y3; \
	VPSRLQ      $52, Y1, Y4; \
	VPAND       Y10, Y4, Y4; \
	VPAND       Y13, Y1, Y5; \
	VPOR        Y12, Y5, Y5; \
	VPSUBQ      Y11, Y4, Y6; \
	VPSUBQ      Y4, Y11, Y7; \
	VPSLLVQ     Y6, Y5, Y6; \
	VPSRLVQ     Y7, Y5, Y7; \
	VPOR        Y7, Y6, Y6; \
	VPCMPGTQ    Y1, Y8, Y7; \
	VPXOR       Y7, Y6, Y6; \
	VPSUBQ      Y7, Y6, Y6; \
	VPADDQ      Y3, Y6, Y6

TEXT ·encodeAVX2(SB), NOSPLIT, $0-56
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         draws+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSD scale+32(FP), Y15
	MOVQ         width+40(FP), R8

	// The constants go to vector registers with VEX VMOVQ: a legacy SSE
	// MOVQ once the upper halves are in use costs this VM's core a
	// transition on every call (it doubled the loop's time).
	MOVQ         $0x40F0000000000000, AX // 2^16
	VMOVQ        AX, X14
	VPBROADCASTQ X14, Y14
	MOVQ         $0x000FFFFFFFFFFFFF, AX // mantissa
	VMOVQ        AX, X13
	VPBROADCASTQ X13, Y13
	MOVQ         $0x0010000000000000, AX // implicit bit
	VMOVQ        AX, X12
	VPBROADCASTQ X12, Y12
	MOVQ         $1075, AX // exponent bias + 52
	VMOVQ        AX, X11
	VPBROADCASTQ X11, Y11
	MOVQ         $0x7FF, AX // exponent
	VMOVQ        AX, X10
	VPBROADCASTQ X10, Y10
	VPXOR        Y9, Y9, Y9 // ties
	VPXOR        Y8, Y8, Y8 // zero

	XORQ BX, BX
	TESTQ CX, CX
	JZ    done
	CMPQ  R8, $8
	JNE   loop4

loop8:
	ROUND4
	VMOVDQU     Y6, (DI)(BX*8)
	ADDQ        $4, BX
	CMPQ        BX, CX
	JB          loop8
	JMP         done

loop4:
	ROUND4
	// Pairs (a, b) → a + 2^32·b (putCoords): lanes 0 and 2 plus lanes
	// 1 and 3 shifted up.
	VPSLLQ      $32, Y6, Y7
	VPERMQ      $0x08, Y6, Y4
	VPERMQ      $0x0D, Y7, Y5
	VPADDQ      Y5, Y4, Y4
	VMOVDQU     X4, (DI)(BX*4)
	ADDQ        $4, BX
	CMPQ        BX, CX
	JB          loop4

done:
	XORQ    AX, AX
	VPTEST  Y9, Y9
	SETNE   AL
	MOVQ    AX, ties+48(FP)
	VZEROUPPER
	RET

// func encodeAddAVX2(dst *byte, x *float64, draws *byte, n int, scale float64, width int, c uint64, s0, s1, s2, s3 *byte) (ties int)
//
// encodeAVX2, but each stored word is the encoded word plus c plus the
// words at the same offset of s0 … s3, mod 2^64 (in Z_2^32 a word is a
// pair of coordinates, as in sumAVX2): the encoding and a batch of masks
// in one store. Every vector register is taken by ROUND4's constants
// and temporaries, so c is broadcast from the frame on each step (an L1
// load, beside the four source loads). Besides ROUND4's prefetch of the
// next tile's input it prefetches the next tile's output: at n = 3 the
// client's CPU time fell by ~5% (the stores no longer wait for lines
// from memory).
TEXT ·encodeAddAVX2(SB), NOSPLIT, $0-96
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         draws+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSD scale+32(FP), Y15
	MOVQ         width+40(FP), R8
	MOVQ         s0+56(FP), R9
	MOVQ         s1+64(FP), R10
	MOVQ         s2+72(FP), R11
	MOVQ         s3+80(FP), R12

	MOVQ         $0x40F0000000000000, AX // 2^16
	VMOVQ        AX, X14
	VPBROADCASTQ X14, Y14
	MOVQ         $0x000FFFFFFFFFFFFF, AX // mantissa
	VMOVQ        AX, X13
	VPBROADCASTQ X13, Y13
	MOVQ         $0x0010000000000000, AX // implicit bit
	VMOVQ        AX, X12
	VPBROADCASTQ X12, Y12
	MOVQ         $1075, AX // exponent bias + 52
	VMOVQ        AX, X11
	VPBROADCASTQ X11, Y11
	MOVQ         $0x7FF, AX // exponent
	VMOVQ        AX, X10
	VPBROADCASTQ X10, Y10
	VPXOR        Y9, Y9, Y9 // ties
	VPXOR        Y8, Y8, Y8 // zero

	XORQ BX, BX
	TESTQ CX, CX
	JZ    adone
	CMPQ  R8, $8
	JNE   aloop4

aloop8:
	ROUND4
	PREFETCHT0   4096(DI)(BX*8)
	VPBROADCASTQ c+48(FP), Y0
	VPADDQ       (R9)(BX*8), Y6, Y6
	VPADDQ       (R10)(BX*8), Y0, Y0
	VPADDQ       (R11)(BX*8), Y6, Y6
	VPADDQ       (R12)(BX*8), Y0, Y0
	VPADDQ       Y0, Y6, Y6
	VMOVDQU      Y6, (DI)(BX*8)
	ADDQ         $4, BX
	CMPQ         BX, CX
	JB           aloop8
	JMP          adone

aloop4:
	ROUND4
	PREFETCHT0   2048(DI)(BX*4)
	VPSLLQ       $32, Y6, Y7
	VPERMQ       $0x08, Y6, Y4
	VPERMQ       $0x0D, Y7, Y5
	VPADDQ       Y5, Y4, Y4
	VPBROADCASTQ c+48(FP), X0
	VPADDQ       (R9)(BX*4), X4, X4
	VPADDQ       (R10)(BX*4), X0, X0
	VPADDQ       (R11)(BX*4), X4, X4
	VPADDQ       (R12)(BX*4), X0, X0
	VPADDQ       X0, X4, X4
	VMOVDQU      X4, (DI)(BX*4)
	ADDQ         $4, BX
	CMPQ         BX, CX
	JB           aloop4

adone:
	XORQ    AX, AX
	VPTEST  Y9, Y9
	SETNE   AL
	MOVQ    AX, ties+88(FP)
	VZEROUPPER
	RET
