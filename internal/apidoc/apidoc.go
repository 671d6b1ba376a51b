// Package apidoc reads what the API references in docs/ (browser-api.md,
// worker-api.md) say about errors: the table of error types with their
// statuses, and the statuses each endpoint's "Errors:" line lists. Tests
// hold the documents to the code with it: internal/contract checks every
// contract.ErrType* is in each table with its status, internal/e2e sends
// a request for each documented error to a real control plane and worker.
//
// Main entry: Load. It is for tests only; it understands the documents'
// own conventions (a section heading naming `METHOD /path`, one endpoint a
// section; in it a sentence "Errors…:" listing statuses in backquotes, up
// to the paragraph's end), not Markdown in general.
package apidoc

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
)

// Doc is what one document says about errors.
type Doc struct {
	// Name is the document's path relative to the repository root, e.g.
	// "docs/browser-api.md", for messages.
	Name string
	// Types maps each error type of the document's error table to its row.
	Types map[string]TypeRow
	// Endpoints maps "METHOD /path" (as the section heading writes it) to
	// its section.
	Endpoints map[string]*Endpoint
}

// TypeRow is one row of the error table.
type TypeRow struct {
	Status int
	// When is the row's description; Unused is set when it says the type
	// is "not used" or "not produced".
	When   string
	Unused bool
	Line   int
}

// Endpoint is a section documenting one endpoint.
type Endpoint struct {
	// Section is the heading's number, e.g. "2.3".
	Section string
	// Errors maps each status the "Errors" list names to the type it
	// names next to it ("" when it gives only the status).
	Errors map[int]string
	// Line is the line where the "Errors" list starts (0: the section has
	// none).
	Line int
}

// Where names the endpoint's section for messages.
func (d *Doc) Where(endpoint string) string {
	e := d.Endpoints[endpoint]
	if e == nil {
		return fmt.Sprintf("%s (no section for %s)", d.Name, endpoint)
	}
	return fmt.Sprintf("%s:%d §%s %s", d.Name, e.Line, e.Section, endpoint)
}

var (
	headingRe = regexp.MustCompile("^#{2,4} ([0-9]+(?:\\.[0-9]+)*[a-z]?) `(GET|POST|PUT|PATCH|DELETE) (/[^` ]*)`")
	anyHeadRe = regexp.MustCompile(`^#{1,4} `)
	statusRe  = regexp.MustCompile("`([1-5][0-9][0-9])(?: ([a-z_]+))?`")
	cellRe    = regexp.MustCompile("^`([a-z_]+)`$")
	numRe     = regexp.MustCompile(`^[1-5][0-9][0-9]$`)
	errorsRe  = regexp.MustCompile(`\bErrors\b[^:]*:`)
)

// Load reads the document at path, relative to the repository root.
func Load(path string) (*Doc, error) {
	f, err := os.Open(filepath.Join(RepoRoot(), path))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d := &Doc{Name: path, Types: map[string]TypeRow{}, Endpoints: map[string]*Endpoint{}}
	var cur *Endpoint
	inErrors := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := headingRe.FindStringSubmatch(line); m != nil {
			key := m[2] + " " + m[3]
			if d.Endpoints[key] != nil {
				return nil, fmt.Errorf("%s:%d: a second section for %s", path, n, key)
			}
			cur = &Endpoint{Section: m[1], Errors: map[int]string{}}
			d.Endpoints[key] = cur
			inErrors = false
			continue
		}
		if anyHeadRe.MatchString(line) {
			cur, inErrors = nil, false
			continue
		}
		if strings.TrimSpace(line) == "" {
			inErrors = false
			continue
		}
		if loc := errorsRe.FindStringIndex(line); cur != nil && loc != nil {
			if cur.Line != 0 {
				return nil, fmt.Errorf("%s:%d: a second Errors list in §%s (one endpoint a section)", path, n, cur.Section)
			}
			cur.Line, inErrors = n, true
			line = line[loc[0]:]
		}
		if inErrors {
			for _, m := range statusRe.FindAllStringSubmatch(line, -1) {
				st, _ := strconv.Atoi(m[1])
				if prev, ok := cur.Errors[st]; ok && prev != "" && m[2] != "" && prev != m[2] {
					return nil, fmt.Errorf("%s:%d: §%s names %d both %s and %s", path, n, cur.Section, st, prev, m[2])
				}
				if cur.Errors[st] == "" {
					cur.Errors[st] = m[2]
				}
			}
		}
		if strings.HasPrefix(line, "|") {
			if err := d.tableRow(line, n); err != nil {
				return nil, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(d.Types) == 0 {
		return nil, fmt.Errorf("%s: no error table (rows of a status and a `type`)", path)
	}
	return d, nil
}

// tableRow records a row of the error table: one cell a status, another an
// error type in backquotes; other tables' rows have no status cell.
func (d *Doc) tableRow(line string, n int) error {
	cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
	status, typ, when := 0, "", ""
	for _, c := range cells {
		c = strings.TrimSpace(c)
		switch {
		case numRe.MatchString(c) && status == 0:
			status, _ = strconv.Atoi(c)
		case cellRe.MatchString(c) && typ == "":
			typ = cellRe.FindStringSubmatch(c)[1]
		default:
			when += c
		}
	}
	if status == 0 || typ == "" {
		return nil
	}
	if prev, ok := d.Types[typ]; ok {
		return fmt.Errorf("%s:%d: error type %s has a second row (first at line %d)", d.Name, n, typ, prev.Line)
	}
	d.Types[typ] = TypeRow{Status: status, When: when, Line: n,
		Unused: strings.Contains(when, "not used") || strings.Contains(when, "not produced")}
	return nil
}

// RepoRoot returns the repository's root directory (where go.mod is).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
