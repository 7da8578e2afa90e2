"""The error Parallax raises for wrong use: its message says what is wrong and what to do."""


class ParallaxError(ValueError):
    pass
