"""mxu.verif: how we know the chip is right. Golden models, testbenches, checkers."""
