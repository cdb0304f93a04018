package model

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/gonum/mat"

	"github.com/scellis/scellis/diag"
	"github.com/scellis/scellis/internal/memlimit"
	"github.com/scellis/scellis/internal/safefile"
)

// LoadCSV reads a dataset from a CSV file with a header row. The column
// named label holds the labels; every other column is a numeric feature.
// The dataset is named after the file's base name without its extension.
// Problems are *diag.Diagnostic values positioned at path:line:col.
func LoadCSV(path, label string) (*Dataset, error) {
	f, _, err := safefile.Open(path, os.O_RDONLY, safefile.MaxDataset)
	if err != nil {
		return nil, diag.New(diag.CSVUnreadable, path, "cannot open the dataset: %v", unwrapPathError(err)).
			At(path, 0, 0).
			WithHelp("check the path and that this process may read the file")
	}
	defer f.Close()
	name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	return parseCSV(f, path, name, label)
}

// LoadFeatures reads a CSV file of features only (every column is one; the
// labels are zeros and Label is empty), for scoring rows nobody labelled.
func LoadFeatures(path string) (*Dataset, error) {
	return LoadCSV(path, "")
}

// ParseCSV reads a dataset from r, as LoadCSV does; name names the dataset and
// stands for the file in diagnostic positions.
func ParseCSV(r io.Reader, name, label string) (*Dataset, error) {
	return parseCSV(r, name, name, label)
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// MaxColumns caps a dataset's columns: a model's every input is a column,
// and a file wider than this is a mistake (a transposed table, a one-hot
// encoding of an identifier) long before it is a dataset.
const MaxColumns = 100_000

// csvCopies is how many copies of a dataset's values its users hold at
// once at most (the loaded table, a pick of the model's columns, a
// standardised copy, a train/test split): the loader refuses a file whose
// values would not fit the memory limit that many times.
const csvCopies = 4

// csvCheckCells is about how many values are read between two checks of
// the memory limit.
const csvCheckCells = 1 << 16

func parseCSV(r io.Reader, file, name, label string) (*Dataset, error) {
	cr := csv.NewReader(bufio.NewReader(memlimit.Reader(r)))
	cr.FieldsPerRecord = -1 // ragged rows are reported here, with a position
	cr.TrimLeadingSpace = true
	cr.ReuseRecord = true

	header, err := cr.Read()
	if err == io.EOF {
		return nil, diag.New(diag.CSVEmpty, name, "the file is empty: no header row and no data rows").
			At(file, 1, 0).
			WithHelp("the first line must name the columns, e.g. age,bmi,%s", labelOr(label))
	}
	if err != nil {
		return nil, csvReadError(file, name, err)
	}
	if len(header) > MaxColumns {
		return nil, diag.New(diag.CSVTooWide, name, "the header has %d columns; a dataset may have at most %d", len(header), MaxColumns).
			At(file, 1, 1).
			WithHelp("keep only the columns a model uses (e.g. cut -d, -f…), or transpose the table if its rows are the variables")
	}
	header = append([]string(nil), header...)
	for i := range header {
		header[i] = strings.TrimSpace(header[i])
	}
	header[0] = strings.TrimPrefix(header[0], "\ufeff") // a UTF-8 byte-order mark

	labelCol := -1
	seen := make(map[string]int, len(header))
	for i, h := range header {
		if j, dup := seen[h]; dup {
			line, col := cr.FieldPos(i)
			return nil, diag.New(diag.ConfigDuplicate, name, "column %q appears twice in the header (columns %d and %d)", h, j+1, i+1).
				At(file, line, col).
				WithSource(strings.Join(header, ",")).
				WithHelp("give every column a distinct name")
		}
		seen[h] = i
		if h == label {
			labelCol = i
		}
	}
	if labelCol < 0 && label != "" {
		d := diag.New(diag.CSVNoLabel, name, "no column named %q in the header", label).
			At(file, 1, 1).
			WithSource(strings.Join(header, ","))
		hint := fmt.Sprintf("the columns are: %s", strings.Join(header, ", "))
		for _, h := range header {
			if strings.EqualFold(h, label) {
				hint = fmt.Sprintf("did you mean %q? the columns are: %s", h, strings.Join(header, ", "))
				break
			}
		}
		return nil, d.WithHelp("%s", hint)
	}
	if len(header) < 2 && labelCol >= 0 {
		return nil, diag.New(diag.CSVEmpty, name, "the only column is the label %q: there are no feature columns", label).
			At(file, 1, 1).
			WithHelp("add at least one numeric feature column")
	}

	features := make([]string, 0, len(header)-1)
	for i, h := range header {
		if i != labelCol {
			features = append(features, h)
		}
	}
	width := len(header)
	var data, ys []float64
	checkEvery := max(1, csvCheckCells/width)
	for row := 0; ; row++ {
		if row%checkEvery == 0 && !memlimit.Fits(int64(len(data)+width)*8*(csvCopies-1)) {
			return nil, memlimit.TooLarge(file, fmt.Sprintf("%d rows of %d columns read so far, and their users copy a dataset's values up to %d times", row, width, csvCopies),
				"split the rows into smaller files, or keep only the columns a model uses")
		}
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, csvReadError(file, name, err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) != width {
			col := 1
			if len(rec) > width {
				_, col = cr.FieldPos(width)
			} else {
				_, c := cr.FieldPos(len(rec) - 1)
				col = c + len(rec[len(rec)-1])
			}
			return nil, diag.New(diag.CSVRagged, name, "row has %d fields but the header has %d", len(rec), width).
				At(file, line, col).
				WithSource(strings.Join(rec, ",")).
				WithHelp("every row needs one value per header column (%s)", strings.Join(header, ", "))
		}
		if labelCol < 0 {
			ys = append(ys, 0) // no label column: features only (LoadFeatures)
		}
		for i, f := range rec {
			v, err := parseNumber(f)
			if err != nil {
				l, c := cr.FieldPos(i)
				return nil, diag.New(diag.CSVBadNumber, name, "column %q: %v", header[i], err).
					At(file, l, c).
					WithSource(strings.Join(rec, ",")).
					WithHelp("every feature and the label must be a finite number; encode categories as 0/1 columns and drop or impute missing values")
			}
			if i == labelCol {
				ys = append(ys, v)
			} else {
				data = append(data, v)
			}
		}
	}
	if len(ys) == 0 {
		return nil, diag.New(diag.CSVEmpty, name, "the header is there but there are no data rows").
			At(file, 2, 0).
			WithHelp("add at least one row of values under the header")
	}
	return &Dataset{
		Name:     name,
		Features: features,
		Label:    label,
		X:        mat.NewDense(len(ys), len(features), data),
		Y:        ys,
	}, nil
}

func labelOr(label string) string {
	if label == "" {
		return "outcome"
	}
	return label
}

// parseNumber accepts finite decimal numbers; the message says what is wrong.
func parseNumber(s string) (float64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty field (missing values are not supported)")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			return 0, fmt.Errorf("%q is out of the range of a float64", s)
		}
		return 0, fmt.Errorf("%q is not a number", s)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q is not a finite number", s)
	}
	return v, nil
}

func csvReadError(file, name string, err error) error {
	if errors.Is(err, memlimit.ErrTooLarge) {
		return memlimit.TooLarge(file, "a line longer than what is left", "split the file, or keep only the columns a model uses")
	}
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return diag.New(diag.CSVUnreadable, name, "malformed CSV: %v", pe.Err).
			At(file, pe.Line, pe.Column).
			WithHelp("quote fields that contain commas or quotes, and double any quote inside a quoted field")
	}
	return diag.New(diag.CSVUnreadable, name, "cannot read the dataset: %v", err).
		At(file, 0, 0).
		WithHelp("check that the file is a readable text CSV")
}

// WriteCSV writes d as CSV with a header row: the feature columns in order,
// then the label column. Numbers use the shortest representation that parses
// back to the same float64, so ParseCSV(WriteCSV(d)) reproduces d exactly.
func WriteCSV(w io.Writer, d *Dataset) error {
	if err := d.check(); err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	cw := csv.NewWriter(bw)
	header := make([]string, 0, len(d.Features)+1)
	header = append(header, d.Features...)
	header = append(header, d.Label)
	if err := cw.Write(header); err != nil {
		return err
	}
	cw.Flush()
	var buf []byte
	for i := range d.Rows() {
		buf = buf[:0]
		for _, v := range d.X.RawRowView(i) {
			buf = strconv.AppendFloat(buf, v, 'g', -1, 64)
			buf = append(buf, ',')
		}
		buf = strconv.AppendFloat(buf, d.Y[i], 'g', -1, 64)
		buf = append(buf, '\n')
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	if err := cw.Error(); err != nil {
		return err
	}
	return bw.Flush()
}
