package com.acme;

/** Integer arithmetic. */
public final class Calculator {

    /** Returns a + b. */
    public int add(int a, int b) {
        return a + b;
    }

    /** Returns base raised to the power exponent; exponent must not be negative. */
    public long power(int base, int exponent) {
        if (exponent < 0) {
            throw new IllegalArgumentException("negative exponent: " + exponent);
        }
        long result = 1;
        for (int i = 1; i < exponent; i++) {
            result *= base;
        }
        return result;
    }
}
