package script

import (
	"fmt"
	"math/bits"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// Repetition is the one Starlark operator whose result can be far larger
// than its operands in a single step: [0] * (1 << 27) builds a 2 GiB list
// before any checkpoint runs. go.starlark.net has no allocation hook, so
// compile rewrites every `a * b` (and `a *= b`) in content into a call of
// the predeclared built-in named "*", which reserves the result's size
// against the memory budget and then performs the ordinary operation. The
// name "*" cannot be written, bound or shadowed by content.

// repeatName is the predeclared name the rewritten multiplications call.
const repeatName = "*"

var repeatBuiltin = starlark.NewBuiltin(repeatName, func(thread *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
	x, y := args[0], args[1]
	if n, what := repeatBytes(x, y); n > 0 {
		if err := stateOf(thread).reserve(n, what); err != nil {
			return nil, err
		}
	}
	return starlark.Binary(syntax.STAR, x, y)
})

// repeatBytes is the size of the sequence x * y (or y * x) would build, and
// a description of it for a refusal; 0 when the product is not a repetition.
func repeatBytes(x, y starlark.Value) (uint64, string) {
	if _, ok := x.(starlark.Int); ok {
		x, y = y, x
	}
	count, ok := y.(starlark.Int)
	if !ok {
		return 0, ""
	}
	var length, per uint64
	switch s := x.(type) {
	case starlark.String:
		length, per = uint64(len(s)), 1
	case starlark.Bytes:
		length, per = uint64(len(s)), 1
	case *starlark.List:
		length, per = uint64(s.Len()), slotBytes
	case starlark.Tuple:
		length, per = uint64(len(s)), slotBytes
	default:
		return 0, ""
	}
	n, ok := count.Uint64()
	if !ok {
		if count.Sign() <= 0 {
			return 0, ""
		}
		n = ^uint64(0) // beyond 64 bits: Binary refuses it, but so does the budget
	}
	if n == 0 || length == 0 {
		return 0, ""
	}
	hi, elems := bits.Mul64(length, n)
	hi2, total := bits.Mul64(elems, per)
	if hi != 0 || hi2 != 0 {
		total = ^uint64(0)
	}
	return total, fmt.Sprintf("repeating a %s of %d elements %s times", x.Type(), length, count)
}

// guardRepetition rewrites the multiplications of a parsed file into calls
// of repeatBuiltin. An augmented `t *= n` becomes `t = *(t, n)` when its
// target can be evaluated twice without effect (a name, or an index or
// field of names and literals); other targets are left as they are.
func guardRepetition(f *syntax.File) {
	var r rewriter
	r.stmts(f.Stmts)
}

type rewriter struct{}

func (r rewriter) stmts(ss []syntax.Stmt) {
	for _, s := range ss {
		r.stmt(s)
	}
}

func (r rewriter) stmt(s syntax.Stmt) {
	switch s := s.(type) {
	case *syntax.AssignStmt:
		s.LHS = r.targets(s.LHS)
		s.RHS = r.expr(s.RHS)
		if s.Op == syntax.STAR_EQ && pure(s.LHS) {
			s.RHS = repeatCall(s.OpPos, clone(s.LHS), s.RHS)
			s.Op = syntax.EQ
		}
	case *syntax.DefStmt:
		r.params(s.Params)
		r.stmts(s.Body)
	case *syntax.ExprStmt:
		s.X = r.expr(s.X)
	case *syntax.ForStmt:
		s.Vars = r.targets(s.Vars)
		s.X = r.expr(s.X)
		r.stmts(s.Body)
	case *syntax.WhileStmt:
		s.Cond = r.expr(s.Cond)
		r.stmts(s.Body)
	case *syntax.IfStmt:
		s.Cond = r.expr(s.Cond)
		r.stmts(s.True)
		r.stmts(s.False)
	case *syntax.ReturnStmt:
		if s.Result != nil {
			s.Result = r.expr(s.Result)
		}
	}
}

// targets rewrites the expressions inside an assignment target (indices),
// never the target's own shape.
func (r rewriter) targets(e syntax.Expr) syntax.Expr {
	switch e := e.(type) {
	case *syntax.IndexExpr:
		e.X, e.Y = r.expr(e.X), r.expr(e.Y)
	case *syntax.DotExpr:
		e.X = r.expr(e.X)
	case *syntax.TupleExpr:
		for i, x := range e.List {
			e.List[i] = r.targets(x)
		}
	case *syntax.ListExpr:
		for i, x := range e.List {
			e.List[i] = r.targets(x)
		}
	case *syntax.ParenExpr:
		e.X = r.targets(e.X)
	}
	return e
}

// params rewrites default values, not the parameter names.
func (r rewriter) params(ps []syntax.Expr) {
	for _, p := range ps {
		if b, ok := p.(*syntax.BinaryExpr); ok && b.Op == syntax.EQ {
			b.Y = r.expr(b.Y)
		}
	}
}

func (r rewriter) exprs(es []syntax.Expr) {
	for i, e := range es {
		es[i] = r.expr(e)
	}
}

func (r rewriter) expr(e syntax.Expr) syntax.Expr {
	switch e := e.(type) {
	case *syntax.BinaryExpr:
		e.X, e.Y = r.expr(e.X), r.expr(e.Y)
		if e.Op == syntax.STAR {
			return repeatCall(e.OpPos, e.X, e.Y)
		}
	case *syntax.CallExpr:
		e.Fn = r.expr(e.Fn)
		for i, a := range e.Args {
			if b, ok := a.(*syntax.BinaryExpr); ok && b.Op == syntax.EQ {
				b.Y = r.expr(b.Y) // keyword argument
				continue
			}
			e.Args[i] = r.expr(a)
		}
	case *syntax.Comprehension:
		e.Body = r.expr(e.Body)
		for _, c := range e.Clauses {
			switch c := c.(type) {
			case *syntax.ForClause:
				c.Vars = r.targets(c.Vars)
				c.X = r.expr(c.X)
			case *syntax.IfClause:
				c.Cond = r.expr(c.Cond)
			}
		}
	case *syntax.CondExpr:
		e.Cond, e.True, e.False = r.expr(e.Cond), r.expr(e.True), r.expr(e.False)
	case *syntax.DictEntry:
		e.Key, e.Value = r.expr(e.Key), r.expr(e.Value)
	case *syntax.DictExpr:
		r.exprs(e.List)
	case *syntax.DotExpr:
		e.X = r.expr(e.X)
	case *syntax.IndexExpr:
		e.X, e.Y = r.expr(e.X), r.expr(e.Y)
	case *syntax.LambdaExpr:
		r.params(e.Params)
		e.Body = r.expr(e.Body)
	case *syntax.ListExpr:
		r.exprs(e.List)
	case *syntax.TupleExpr:
		r.exprs(e.List)
	case *syntax.ParenExpr:
		e.X = r.expr(e.X)
	case *syntax.SliceExpr:
		e.X = r.expr(e.X)
		if e.Lo != nil {
			e.Lo = r.expr(e.Lo)
		}
		if e.Hi != nil {
			e.Hi = r.expr(e.Hi)
		}
		if e.Step != nil {
			e.Step = r.expr(e.Step)
		}
	case *syntax.UnaryExpr:
		if e.X != nil {
			e.X = r.expr(e.X)
		}
	}
	return e
}

func repeatCall(at syntax.Position, x, y syntax.Expr) syntax.Expr {
	return &syntax.CallExpr{
		Fn:     &syntax.Ident{NamePos: at, Name: repeatName},
		Lparen: at,
		Args:   []syntax.Expr{x, y},
		Rparen: at,
	}
}

// pure reports whether evaluating e twice reads the same value and has no
// effect: names, literals, and fields or indices of those.
func pure(e syntax.Expr) bool {
	switch e := e.(type) {
	case *syntax.Ident, *syntax.Literal:
		return true
	case *syntax.ParenExpr:
		return pure(e.X)
	case *syntax.DotExpr:
		return pure(e.X)
	case *syntax.IndexExpr:
		return pure(e.X) && pure(e.Y)
	}
	return false
}

// clone copies a pure expression, so that the resolver binds the copy's
// names on their own (an Ident records its binding).
func clone(e syntax.Expr) syntax.Expr {
	switch e := e.(type) {
	case *syntax.Ident:
		return &syntax.Ident{NamePos: e.NamePos, Name: e.Name}
	case *syntax.Literal:
		c := *e
		return &c
	case *syntax.ParenExpr:
		return &syntax.ParenExpr{Lparen: e.Lparen, X: clone(e.X), Rparen: e.Rparen}
	case *syntax.DotExpr:
		return &syntax.DotExpr{X: clone(e.X), Dot: e.Dot, NamePos: e.NamePos, Name: &syntax.Ident{NamePos: e.Name.NamePos, Name: e.Name.Name}}
	case *syntax.IndexExpr:
		return &syntax.IndexExpr{X: clone(e.X), Lbrack: e.Lbrack, Y: clone(e.Y), Rbrack: e.Rbrack}
	}
	return e
}
