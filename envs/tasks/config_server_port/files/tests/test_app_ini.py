import configparser

CFG = configparser.ConfigParser()
CFG.read("app.ini")


def test_server_port():
    assert CFG.getint("server", "port") == 9090


def test_others_unchanged():
    assert CFG.getint("database", "port") == 5432
    assert CFG.get("server", "host") == "0.0.0.0"
    assert CFG.getint("server", "workers") == 2
