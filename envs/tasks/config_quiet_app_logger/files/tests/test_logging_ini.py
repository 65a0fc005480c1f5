import configparser
import logging
import logging.config


def test_app_level():
    logging.config.fileConfig("logging.ini", disable_existing_loggers=False)
    assert logging.getLogger("app").getEffectiveLevel() == logging.WARNING


def test_structure_unchanged():
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read("logging.ini")
    assert cfg.get("logger_root", "level") == "WARNING"
    assert cfg.get("logger_app", "qualname") == "app"
    assert cfg.get("handler_console", "class") == "StreamHandler"
