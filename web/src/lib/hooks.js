import { useEffect, useRef, useState } from "preact/hooks";

// useNow re-renders every `ms` milliseconds and returns the time, for
// relative times and countdowns.
export function useNow(ms) {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(t);
  }, [ms]);
  return now;
}

// useVisible tells whether the page is visible (not a background tab).
export function useVisible() {
  const [v, setV] = useState(document.visibilityState !== "hidden");
  useEffect(() => {
    const f = () => setV(document.visibilityState !== "hidden");
    document.addEventListener("visibilitychange", f);
    return () => document.removeEventListener("visibilitychange", f);
  }, []);
  return v;
}

// useLatest keeps a ref to the newest value, for callbacks of long-lived
// effects.
export function useLatest(v) {
  const r = useRef(v);
  r.current = v;
  return r;
}
