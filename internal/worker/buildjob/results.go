package buildjob

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/talkide/talkide/internal/worker/agentfs"
)

// Bounds of a results read.
const (
	maxTaskDirs    = 64   // directories under build/test-results (one per test task)
	maxReportFiles = 4096 // report files read in all
	// MaxReportTotal bounds the bytes of all reports one build's results
	// read: the worker parses them, and a build could otherwise have it
	// parse thousands of large files (or one file, hard-linked). A file
	// counts its size at open or the bytes read of it, whichever is more:
	// the agent's processes can still write to it while the worker reads.
	MaxReportTotal = 64 << 20
)

// ReadResults reads a finished build's JUnit reports from the
// conversation's working tree, <workspaceRoot>/<conversation>/ReportsDir/
// <task>/TEST-*.xml, as the files the build wrote (logs can lose lines at
// rotation; these do not). The tree is the agent's: nothing in it is
// followed (agentfs: no symbolic link in any component, no FIFO or device
// opened), reports must be regular files owned by uid (the agent's; a hard
// link to another's file is refused) and within MaxReportBytes, and at most
// maxReportFiles and MaxReportTotal bytes are read. A report that cannot be
// read or parsed is skipped and named in skipped, with why; one whose
// reading stopped at a bound of its shape counts up to there and is named
// in r.Truncated (ParseJUnit); err is for a tree with no reports directory
// at all (fs.ErrNotExist inside) or that cannot be read.
func ReadResults(workspaceRoot, conversation string, uid int) (r Results, skipped []string, err error) {
	if !idPattern.MatchString(conversation) {
		return r, nil, fmt.Errorf("conversation %q: want letters, digits, - and _", conversation)
	}
	root, err := agentfs.OpenRoot(workspaceRoot)
	if err != nil {
		return r, nil, err
	}
	defer root.Close()
	reports, err := root.OpenDir(conversation + "/" + ReportsDir)
	if err != nil {
		return r, nil, err
	}
	defer reports.Close()
	tasks, err := reports.Names(maxTaskDirs)
	if err != nil && !errors.Is(err, agentfs.ErrTooMany) {
		return r, nil, err
	}
	slices.Sort(tasks)
	read := 0
	var total int64
	over := false
	for _, task := range tasks {
		dir, err := reports.OpenDir(task)
		if err != nil {
			skipped = append(skipped, task+": "+agentfs.Category(err))
			continue
		}
		names, err := dir.Names(maxReportFiles)
		if err != nil && !errors.Is(err, agentfs.ErrTooMany) {
			skipped = append(skipped, task+": "+agentfs.Category(err))
		}
		slices.Sort(names)
		for _, name := range names {
			if !strings.HasPrefix(name, "TEST-") || !strings.HasSuffix(name, ".xml") {
				continue
			}
			if read == maxReportFiles {
				skipped = append(skipped, fmt.Sprintf("%s/%s and further reports: more than %d", task, name, maxReportFiles))
				break
			}
			read++
			f, size, err := dir.Open(name, agentfs.Limits{MaxBytes: MaxReportBytes, UID: uid})
			if err != nil {
				skipped = append(skipped, task+"/"+name+": "+agentfs.Category(err))
				continue
			}
			if st, ok := statOf(f); !ok || st.Nlink != 1 {
				// Gradle writes each report once; a file of several names
				// is one the build linked to be read many times.
				f.Close()
				skipped = append(skipped, task+"/"+name+": hard-linked")
				continue
			}
			if total+size > MaxReportTotal {
				f.Close()
				skipped = append(skipped, fmt.Sprintf("%s/%s and further reports: over %d MiB of reports in all", task, name, MaxReportTotal>>20))
				over = true
				break
			}
			n, err := r.parseReport(f, task+"/"+name, min(MaxReportBytes, MaxReportTotal-total))
			f.Close()
			total += max(size, n)
			switch {
			case errors.Is(err, ErrReportTooLarge): // it grew since it was opened
				skipped = append(skipped, task+"/"+name+": "+agentfs.Category(agentfs.ErrTooLarge))
			case err != nil:
				skipped = append(skipped, task+"/"+name+": not a JUnit report")
			}
		}
		dir.Close()
		if over {
			break
		}
	}
	return r, skipped, nil
}

func statOf(f *os.File) (*syscall.Stat_t, bool) {
	fi, err := f.Stat()
	if err != nil {
		return nil, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return st, ok
}

// readResults reads the JUnit reports req's build left in its working tree
// under workspaceRoot into rep; a build that left no reports directory has
// none, and one that cannot be read is named in rep.Skipped.
func (rep *Report) readResults(workspaceRoot string, req Request) {
	r, skipped, err := ReadResults(workspaceRoot, req.Conversation, int(req.RunAsUser))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: %v", ReportsDir, err))
	default:
		rep.Results, rep.Skipped = r, skipped
	}
}
