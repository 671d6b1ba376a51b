package com.acme;

import static org.junit.Assert.assertEquals;

import org.junit.Test;

public class CalculatorTest {

    private final Calculator calculator = new Calculator();

    @Test
    public void addsTwoNumbers() {
        assertEquals(5, calculator.add(2, 3));
    }

    @Test
    public void raisesToAPower() {
        assertEquals(8L, calculator.power(2, 3));
    }
}
