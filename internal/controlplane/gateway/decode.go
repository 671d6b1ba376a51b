package gateway

import (
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
)

// Decoding a compressed answer for the meter, beside the bytes passed on.

// errDecode stops a decodeTee's writer once decoding failed.
var errDecode = errors.New("decode answer for metering")

// decodeTee decodes a compressed answer for the meter on its own goroutine,
// fed through a pipe; the bytes relayed to the client are untouched. Memory
// is bounded by the decoder's window. Writes never fail.
type decodeTee struct {
	pw   *io.PipeWriter
	done chan struct{}
	err  error // set before done closes
}

func newDecodeTee(enc string, dst io.Writer) *decodeTee {
	pr, pw := io.Pipe()
	d := &decodeTee{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		var r io.Reader
		var err error
		if enc == "deflate" {
			r, err = zlib.NewReader(pr)
		} else {
			r, err = gzip.NewReader(pr)
		}
		if err == nil {
			_, err = io.Copy(dst, r)
		}
		d.err = err
		pr.CloseWithError(errDecode) // later writes return at once
	}()
	return d
}

func (d *decodeTee) Write(p []byte) (int, error) {
	_, _ = d.pw.Write(p)
	return len(p), nil
}

// finish ends the input and waits for the decoder; it returns the decoding
// error, if any (a cut stream ends in io.ErrUnexpectedEOF).
func (d *decodeTee) finish() error {
	d.pw.Close()
	<-d.done
	return d.err
}
