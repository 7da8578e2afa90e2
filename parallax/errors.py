"""The errors Parallax raises for wrong use: each message says what is wrong and what to do."""


class ParallaxError(ValueError):
    pass


class ConfigError(ParallaxError):
    """A wrong option of parallax.Config or one of its parts; `option` is its keyword, which
    the message names too."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option
