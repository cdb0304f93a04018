//go:build amd64 && !purego

#include "textflag.h"

// func sumAVX2(dst, s0, s1, s2, s3 *byte, n int, c uint64, k int)
//
// For i in [0, n) step 8 (n a multiple of 64): the little-endian word at
// dst+i becomes itself + c + the words at s0+i … s(k-1)+i, mod 2^64.
// Plain 64-bit lane additions (VPADDQ): no carries cross words.
TEXT ·sumAVX2(SB), NOSPLIT, $0-64
	MOVQ         dst+0(FP), DI
	MOVQ         s0+8(FP), R8
	MOVQ         s1+16(FP), R9
	MOVQ         s2+24(FP), R10
	MOVQ         s3+32(FP), R11
	MOVQ         n+40(FP), CX
	VPBROADCASTQ c+48(FP), Y15
	MOVQ         k+56(FP), DX
	XORQ         BX, BX
	TESTQ        CX, CX
	JZ           done
	CMPQ         DX, $1
	JEQ          loop1
	CMPQ         DX, $2
	JEQ          loop2
	CMPQ         DX, $3
	JEQ          loop3

loop4:
	VMOVDQU (DI)(BX*1), Y0
	VMOVDQU 32(DI)(BX*1), Y1
	VPADDQ  Y15, Y0, Y0
	VPADDQ  Y15, Y1, Y1
	VPADDQ  (R8)(BX*1), Y0, Y0
	VPADDQ  32(R8)(BX*1), Y1, Y1
	VPADDQ  (R9)(BX*1), Y0, Y0
	VPADDQ  32(R9)(BX*1), Y1, Y1
	VPADDQ  (R10)(BX*1), Y0, Y0
	VPADDQ  32(R10)(BX*1), Y1, Y1
	VPADDQ  (R11)(BX*1), Y0, Y0
	VPADDQ  32(R11)(BX*1), Y1, Y1
	VMOVDQU Y0, (DI)(BX*1)
	VMOVDQU Y1, 32(DI)(BX*1)
	ADDQ    $64, BX
	CMPQ    BX, CX
	JB      loop4
	JMP     done

loop3:
	VMOVDQU (DI)(BX*1), Y0
	VMOVDQU 32(DI)(BX*1), Y1
	VPADDQ  Y15, Y0, Y0
	VPADDQ  Y15, Y1, Y1
	VPADDQ  (R8)(BX*1), Y0, Y0
	VPADDQ  32(R8)(BX*1), Y1, Y1
	VPADDQ  (R9)(BX*1), Y0, Y0
	VPADDQ  32(R9)(BX*1), Y1, Y1
	VPADDQ  (R10)(BX*1), Y0, Y0
	VPADDQ  32(R10)(BX*1), Y1, Y1
	VMOVDQU Y0, (DI)(BX*1)
	VMOVDQU Y1, 32(DI)(BX*1)
	ADDQ    $64, BX
	CMPQ    BX, CX
	JB      loop3
	JMP     done

loop2:
	VMOVDQU (DI)(BX*1), Y0
	VMOVDQU 32(DI)(BX*1), Y1
	VPADDQ  Y15, Y0, Y0
	VPADDQ  Y15, Y1, Y1
	VPADDQ  (R8)(BX*1), Y0, Y0
	VPADDQ  32(R8)(BX*1), Y1, Y1
	VPADDQ  (R9)(BX*1), Y0, Y0
	VPADDQ  32(R9)(BX*1), Y1, Y1
	VMOVDQU Y0, (DI)(BX*1)
	VMOVDQU Y1, 32(DI)(BX*1)
	ADDQ    $64, BX
	CMPQ    BX, CX
	JB      loop2
	JMP     done

loop1:
	VMOVDQU (DI)(BX*1), Y0
	VMOVDQU 32(DI)(BX*1), Y1
	VPADDQ  Y15, Y0, Y0
	VPADDQ  Y15, Y1, Y1
	VPADDQ  (R8)(BX*1), Y0, Y0
	VPADDQ  32(R8)(BX*1), Y1, Y1
	VMOVDQU Y0, (DI)(BX*1)
	VMOVDQU Y1, 32(DI)(BX*1)
	ADDQ    $64, BX
	CMPQ    BX, CX
	JB      loop1

done:
	VZEROUPPER
	RET
