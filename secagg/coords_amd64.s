//go:build amd64 && !purego

#include "textflag.h"

// func coordsAddAVX2(dst *byte, v *int64, n int, width int, c uint64, s0, s1, s2, s3 *byte)
//
// putCoords followed by sumWords, in one store per word, eight values
// (n a multiple of 8) a step: dst's words become the ring images of v
// (width 8: v_i; width 4: the pair word v_2i + 2^32·v_2i+1 mod 2^64)
// plus c plus the words of s0 … s3 at the same offsets. Both prefetch
// the next tile's input (4 KiB of output ahead) and output, as
// encodeAddAVX2 does: the input comes from memory, once.
TEXT ·coordsAddAVX2(SB), NOSPLIT, $0-72
	MOVQ         dst+0(FP), DI
	MOVQ         v+8(FP), SI
	MOVQ         n+16(FP), CX
	MOVQ         width+24(FP), R8
	VPBROADCASTQ c+32(FP), Y15
	MOVQ         s0+40(FP), R9
	MOVQ         s1+48(FP), R10
	MOVQ         s2+56(FP), R11
	MOVQ         s3+64(FP), R12
	XORQ         BX, BX
	TESTQ        CX, CX
	JZ           done
	CMPQ         R8, $8
	JNE          loop4

	// Width 8: BX counts values; the word of value i is at 8·i.
loop8:
	PREFETCHT0 4096(SI)(BX*8)
	PREFETCHT0 4096(DI)(BX*8)
	VMOVDQU    (SI)(BX*8), Y0
	VMOVDQU    32(SI)(BX*8), Y1
	VPADDQ     Y15, Y0, Y0
	VPADDQ     Y15, Y1, Y1
	VPADDQ     (R9)(BX*8), Y0, Y0
	VPADDQ     32(R9)(BX*8), Y1, Y1
	VPADDQ     (R10)(BX*8), Y0, Y0
	VPADDQ     32(R10)(BX*8), Y1, Y1
	VPADDQ     (R11)(BX*8), Y0, Y0
	VPADDQ     32(R11)(BX*8), Y1, Y1
	VPADDQ     (R12)(BX*8), Y0, Y0
	VPADDQ     32(R12)(BX*8), Y1, Y1
	VMOVDQU    Y0, (DI)(BX*8)
	VMOVDQU    Y1, 32(DI)(BX*8)
	ADDQ       $8, BX
	CMPQ       BX, CX
	JB         loop8
	JMP        done

	// Width 4: eight values [a0 b0 a1 b1], [a2 b2 a3 b3] make the four
	// pair words a_i + 2^32·b_i at 4·BX: the a's and b's are gathered
	// per 128-bit lane (VPUNPCKLQDQ, VPUNPCKHQDQ: [a0 a2 | a1 a3]),
	// combined, and put in order (VPERMQ 0,2,1,3).
loop4:
	PREFETCHT0  8192(SI)(BX*8)
	PREFETCHT0  4096(DI)(BX*4)
	VMOVDQU     (SI)(BX*8), Y0
	VMOVDQU     32(SI)(BX*8), Y1
	VPUNPCKLQDQ Y1, Y0, Y2
	VPUNPCKHQDQ Y1, Y0, Y3
	VPSLLQ      $32, Y3, Y3
	VPADDQ      Y3, Y2, Y2
	VPERMQ      $0xD8, Y2, Y2
	VPADDQ      Y15, Y2, Y2
	VPADDQ      (R9)(BX*4), Y2, Y2
	VPADDQ      (R10)(BX*4), Y2, Y2
	VPADDQ      (R11)(BX*4), Y2, Y2
	VPADDQ      (R12)(BX*4), Y2, Y2
	VMOVDQU     Y2, (DI)(BX*4)
	ADDQ        $8, BX
	CMPQ        BX, CX
	JB          loop4

done:
	VZEROUPPER
	RET
