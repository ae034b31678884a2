// Package condition compiles and evaluates the `when` expressions of
// defaults and overrides (docs/policy.md#defaults-and-overrides): boolean
// CEL expressions over the conf a default or override is about to patch,
// bound to the variable `self`.
//
// It is the one home of the CEL environment: resource validation compiles
// every expression with it (so a `when` that does not compile, is not
// boolean or may cost too much is refused at write time) and the policy
// engine evaluates the same compiled programs.
//
// Contract: an Env and the Exprs it compiles are immutable and safe for
// concurrent use.
package condition

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp/syntax"
	"strconv"
	"sync/atomic"
	"time"

	"cel.dev/cel-go/cel"
	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	celoverloads "cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
)

// Limits on what an operator may write. They bound the work the zone does
// per evaluation, whatever the expression.
const (
	// MaxLength is the longest expression accepted, in bytes.
	MaxLength = 2048
	// MaxEstimatedCost bounds the checker's worst-case cost estimate,
	// computed assuming no list, map or string in a conf exceeds
	// assumedMaxSize elements.
	MaxEstimatedCost = 100_000
	// RuntimeCostLimit stops an evaluation that costs more than this anyway
	// (a conf larger than assumed); the evaluation then fails and the
	// condition counts as false.
	RuntimeCostLimit = 1_000_000
	// MaxRegexInstructions bounds the compiled program of a regular
	// expression given to matches(): CEL's cost model counts the strings a
	// regex reads, not the regex, and a nested repetition of 1 KB compiles
	// to a program that runs 270 ms per evaluation.
	MaxRegexInstructions = 512
	// MaxEvalTime stops one evaluation that runs longer anyway (it then
	// fails, and counts as false).
	MaxEvalTime = 5 * time.Millisecond

	assumedMaxSize = 1000
)

// ErrBudget is wrapped by Eval once a Budget is used up.
var ErrBudget = errors.New("the time this snapshot may spend on when expressions is used up")

// Budget is the evaluation time a zone's snapshot may spend on `when`
// expressions in all (every query of the snapshot draws on it), so that a
// few costly expressions cannot keep the zone's cores busy. Safe for
// concurrent use.
type Budget struct{ left atomic.Int64 } // nanoseconds

// NewBudget allows total evaluation time.
func NewBudget(total time.Duration) *Budget {
	b := &Budget{}
	b.left.Store(int64(total))
	return b
}

// ErrInvalid wraps every compile-time problem.
var ErrInvalid = errors.New("invalid when expression")

// Env compiles expressions. Build it once with New.
type Env struct {
	env *cel.Env
}

// New builds the CEL environment: one variable, `self`, a dynamic JSON value
// (objects are maps with string keys), plus CEL's standard library
// (duration(), timestamp(), has(), size(), string functions, comparisons).
func New() (*Env, error) {
	env, err := cel.NewEnv(cel.Variable("self", cel.DynType))
	if err != nil {
		return nil, fmt.Errorf("condition: building CEL environment: %w", err)
	}
	return &Env{env: env}, nil
}

// Expr is a compiled expression.
type Expr struct {
	src string
	prg cel.Program
}

// Source returns the expression as written.
func (e *Expr) Source() string { return e.src }

// Compile parses and type-checks src. It fails (wrapping ErrInvalid) when
// the expression does not parse, cannot be boolean, or may cost more than
// MaxEstimatedCost.
func (e *Env) Compile(src string) (*Expr, error) {
	if len(src) > MaxLength {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalid, len(src), MaxLength)
	}
	ast, iss := e.env.Compile(src)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, iss.Err())
	}
	out := ast.OutputType()
	if !out.IsExactType(types.BoolType) && !out.IsExactType(types.DynType) {
		return nil, fmt.Errorf("%w: must evaluate to a boolean, it evaluates to %s", ErrInvalid, out)
	}
	est, err := e.env.EstimateCost(ast, sizeEstimator{})
	if err != nil {
		return nil, fmt.Errorf("%w: estimating cost: %v", ErrInvalid, err)
	}
	if est.Max > MaxEstimatedCost {
		return nil, fmt.Errorf("%w: estimated cost %d exceeds the limit %d (simplify the expression)", ErrInvalid, est.Max, MaxEstimatedCost)
	}
	if err := checkRegexes(ast); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	// Constant regexes are compiled once, with the program; an evaluation
	// checks its deadline every 64 comprehension steps.
	prg, err := e.env.Program(ast, cel.CostLimit(RuntimeCostLimit), cel.EvalOptions(cel.OptOptimize),
		cel.InterruptCheckFrequency(64))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return &Expr{src: src, prg: prg}, nil
}

// checkRegexes refuses a matches() whose pattern is not a string literal
// (it would be compiled at every evaluation, from data) or whose compiled
// program exceeds MaxRegexInstructions.
func checkRegexes(a *cel.Ast) error {
	var err error
	celast.PreOrderVisit(a.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if err != nil || e.Kind() != celast.CallKind || e.AsCall().FunctionName() != celoverloads.Matches {
			return
		}
		args := e.AsCall().Args()
		if len(args) == 0 {
			return
		}
		pattern := args[len(args)-1]
		if pattern.Kind() != celast.LiteralKind {
			err = errors.New("matches() takes a string literal as its pattern")
			return
		}
		s, ok := pattern.AsLiteral().Value().(string)
		if !ok {
			err = errors.New("matches() takes a string literal as its pattern")
			return
		}
		err = checkRegex(s)
	}))
	return err
}

func checkRegex(pattern string) error {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return fmt.Errorf("matches(%q): %v", pattern, err)
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return fmt.Errorf("matches(%q): %v", pattern, err)
	}
	if n := len(prog.Inst); n > MaxRegexInstructions {
		return fmt.Errorf("matches(%q): the regular expression compiles to %d instructions, at most %d (simplify its repetitions)",
			pattern, n, MaxRegexInstructions)
	}
	return nil
}

// Eval evaluates the expression with self bound to conf, a decoded JSON
// value (numbers may be json.Number; nil means "no conf yet" and is bound
// as an empty object), within MaxEvalTime and the time left in budget (nil:
// no budget). A failure (a missing field, a type mismatch, a non-boolean
// result, the runtime cost limit, the time) is an error; callers treat it
// as false and report it.
func (e *Expr) Eval(conf any, budget *Budget) (bool, error) {
	if conf == nil {
		conf = map[string]any{}
	}
	limit := MaxEvalTime
	if budget != nil {
		left := time.Duration(budget.left.Load())
		if left <= 0 {
			return false, fmt.Errorf("when %q: %w", e.src, ErrBudget)
		}
		limit = min(limit, left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	start := time.Now()
	out, _, err := e.prg.ContextEval(ctx, map[string]any{"self": celValue(conf)})
	cancel()
	if budget != nil {
		budget.left.Add(-int64(time.Since(start)))
	}
	if err != nil {
		return false, fmt.Errorf("when %q: %w", e.src, err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("when %q: evaluated to %v (%s), not a boolean", e.src, out.Value(), out.Type().TypeName())
	}
	return b, nil
}

// celValue converts decoded JSON into values CEL's default adapter knows:
// json.Number becomes int64 when integral (so `self.x == 3` holds), else
// float64.
func celValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			out[k] = celValue(val)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, val := range x {
			out[i] = celValue(val)
		}
		return out
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i
		}
		if f, err := strconv.ParseFloat(string(x), 64); err == nil {
			return f
		}
		return string(x)
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
		return x
	}
	return v
}

// sizeEstimator assumes every collection or string in a conf holds at most
// assumedMaxSize elements, which makes the cost of comprehensions finite.
type sizeEstimator struct{}

func (sizeEstimator) EstimateSize(cost.AstNode) *cost.SizeEstimate {
	return &cost.SizeEstimate{Min: 0, Max: assumedMaxSize}
}

func (sizeEstimator) EstimateCallCost(string, string, *cost.AstNode, []cost.AstNode) *cost.CallEstimate {
	return nil
}
