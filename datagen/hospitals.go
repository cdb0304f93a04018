package datagen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/model"
)

// HospitalLabel is the label column of hospital data: 1 when the (fictional)
// patient had a cardiovascular event within five years, else 0.
const HospitalLabel = "outcome"

// hospitalFeatures and hospitalWeights are the true logistic model of
// hospital outcomes, per unit of each raw feature:
//
//	feature           unit                 weight
//	age               years                +0.050
//	sex               0 female, 1 male     +0.400
//	bmi               kg/m²                +0.060
//	systolic_bp       mmHg                 +0.020
//	glucose           mg/dL (fasting)      +0.012
//	cholesterol       mg/dL (total)        +0.006
//	smoker            0/1                  +0.700
//	exercise_hours    hours per week       −0.080
//	prior_admissions  count, last 5 years  +0.300
//	(intercept)                            −11.0, plus a site offset
//
// Each site adds its own intercept offset (drawn from N(0, 0.3²)) for case
// mix the features do not capture; Site.Truth holds the exact model of each
// site, offset included.
var (
	hospitalFeatures = []string{"age", "sex", "bmi", "systolic_bp", "glucose", "cholesterol", "smoker", "exercise_hours", "prior_admissions"}
	hospitalWeights  = []float64{0.050, 0.400, 0.060, 0.020, 0.012, 0.006, 0.700, -0.080, 0.300}
)

// HospitalIntercept is the intercept of the true model before site offsets.
const HospitalIntercept = -11.0

// HospitalModel returns the feature names and true per-unit weights of the
// hospital outcome model (see the table above), as fresh copies.
func HospitalModel() (features []string, weights []float64) {
	return slices.Clone(hospitalFeatures), slices.Clone(hospitalWeights)
}

// hospitalProfile is what makes one site's patients differ from another's.
type hospitalProfile struct {
	ageMean, ageSD float64
	maleFrac       float64
	smokeRate      float64
	exerciseMean   float64
	bmiShift       float64
	sbpShift       float64
	glucoseShift   float64
	cholShift      float64
	offset         float64 // intercept offset of the site's true model
}

// Limits on Hospitals' arguments.
const (
	maxSites = 1000
	maxRows  = 10_000_000
)

// Hospitals generates rowsPerSite patient records for each of sites
// hospitals, named hospital-1 … hospital-N (zero-padded when N ≥ 10).
//
// The sites are non-IID: their mean patient age runs from about 38 to 70
// across sites (a young urban population to a geriatric one), and sex mix,
// smoking rate, exercise, and BMI, blood-pressure, glucose and cholesterol
// levels shift per site, as does the intercept of the outcome model; so
// outcome prevalence differs widely between sites. Within a site, features
// correlate as they do in life (blood pressure and glucose rise with age and
// BMI; diabetics have high glucose). Values are rounded as a record would
// hold them (age, blood pressure, glucose and cholesterol whole, BMI and
// exercise to one decimal), and labels are drawn from the true model on the
// rounded values.
func Hospitals(sites int, rowsPerSite int, seed uint64) ([]Site, error) {
	if sites < 1 || sites > maxSites {
		return nil, diag.New(diag.InvalidValue, "datagen hospitals", "number of sites %d is outside 1..%d", sites, maxSites).
			WithHelp("a federation demo uses 4 sites; secure aggregation needs at least 3")
	}
	if rowsPerSite < 1 || rowsPerSite > maxRows {
		return nil, diag.New(diag.InvalidValue, "datagen hospitals", "rows per site %d is outside 1..%d", rowsPerSite, maxRows)
	}
	pr := newRand(seed, "hospitals/profiles")
	out := make([]Site, sites)
	for s := range sites {
		u := pr.Float64
		p := hospitalProfile{
			ageMean:      55 + pr.NormFloat64()*2,
			ageSD:        10 + 6*u(),
			maleFrac:     0.35 + 0.3*u(),
			smokeRate:    0.08 + 0.27*u(),
			exerciseMean: 1.5 + 3*u(),
			bmiShift:     normal(pr, 0, 1.5),
			sbpShift:     normal(pr, 0, 5),
			glucoseShift: normal(pr, 0, 6),
			cholShift:    normal(pr, 0, 12),
			offset:       normal(pr, 0, 0.3),
		}
		if sites > 1 {
			p.ageMean += -17 + 32*float64(s)/float64(sites-1)
		}
		out[s] = hospitalSite(siteName("hospital", s, sites), p, rowsPerSite, newRand(seed, fmt.Sprintf("hospitals/site/%d", s)))
	}
	return out, nil
}

func hospitalSite(name string, p hospitalProfile, n int, r *rand.Rand) Site {
	d := len(hospitalFeatures)
	truth := &model.Model{
		Spec:   model.Spec{Kind: model.KindLogistic, Inputs: d},
		Params: append(slices.Clone(hospitalWeights), HospitalIntercept+p.offset),
	}
	x := make([]float64, n*d)
	y := make([]float64, n)
	for i := range n {
		row := x[i*d : (i+1)*d]
		hospitalPatient(r, p, row)
		z := truth.Params[d]
		for j, v := range row {
			z += truth.Params[j] * v
		}
		y[i] = bernoulli(r, sigmoid(z))
	}
	return Site{
		Name: name,
		Data: &model.Dataset{
			Name:     name,
			Features: slices.Clone(hospitalFeatures),
			Label:    HospitalLabel,
			X:        mat.NewDense(n, d, x),
			Y:        y,
		},
		Truth: truth,
	}
}

// hospitalPatient fills row (in hospitalFeatures order) with one patient.
func hospitalPatient(r *rand.Rand, p hospitalProfile, row []float64) {
	age := round(clamp(normal(r, p.ageMean, p.ageSD), 18, 95), 0)
	sex := bernoulli(r, p.maleFrac)
	bmi := round(clamp(normal(r, 25.5+0.04*(age-50)+0.6*sex+p.bmiShift, 4.5), 15, 60), 1)
	smokeP := p.smokeRate
	if age >= 65 {
		smokeP *= 0.6
	}
	smoker := bernoulli(r, smokeP)
	sbp := round(clamp(normal(r, 112+0.5*(age-40)+0.9*(bmi-25)+4*sex+3*smoker+p.sbpShift, 13), 85, 230), 0)
	diabetic := bernoulli(r, sigmoid(-4+0.04*(age-40)+0.12*(bmi-25)))
	glucose := normal(r, 88+0.25*(age-40)+1.2*(bmi-25)+p.glucoseShift, 11)
	if diabetic == 1 {
		glucose += 45 + math.Abs(normal(r, 0, 40))
	}
	glucose = round(clamp(glucose, 55, 450), 0)
	chol := round(clamp(normal(r, 185+0.6*(age-40)+0.8*(bmi-25)+p.cholShift, 35), 100, 380), 0)
	exercise := round(clamp(normal(r, p.exerciseMean-0.08*(bmi-25)-0.02*(age-50), 1.8), 0, 20), 1)
	prior := math.Min(poisson(r, 0.15+0.015*math.Max(0, age-45)+0.2*smoker+0.3*diabetic), 10)
	row[0], row[1], row[2], row[3], row[4] = age, sex, bmi, sbp, glucose
	row[5], row[6], row[7], row[8] = chol, smoker, exercise, prior
}
